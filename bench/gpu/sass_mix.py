#!/usr/bin/env python3
"""bench/gpu/sass_mix.py NVDISASM CUBIN OUT — the instruction mix of each kernel's main loop.
(--self-test: the parsing on made-up input; ctest gpu_sass_mix_logic.)

Disassembles CUBIN (sm_90) with NVDISASM and writes OUT, one line per kernel that has a loop
holding tensor-core instructions:

    MANGLED_NAME STATIC_INSTRUCTIONS STATIC_MMA PATH_INSTRUCTIONS PATH_MMA UNDECODED

The main loop is the loop (a branch back to a label above it) holding the most MMA
instructions (HMMA; the innermost such loop on a tie). STATIC counts every instruction of
its body, both sides of every branch included; PATH counts the shortest way through it, from
its head to its back edge, which is the path a tile that needs no special case takes (no
masked element, no non-finite flag, no rescale): the share a steady full tile executes.
NOPs are not counted. bench_cuda_static prints the shares (MMA / instructions).

UNDECODED counts the instructions of the whole kernel the disassembler left out: an address
it skipped (CUDA 11.8's nvdisasm skips the VIADD of newer compilers without a word). Each is
counted where it stood, as an instruction of unknown kind; a branch to a label lost with one
is followed only by falling through, so PATH can then be too long. CUDA 12.4's nvdisasm
(Debian 13's nvidia-cuda-toolkit, which bench/gpu/fetch_nvdisasm.sh takes first) decodes
everything CUDA 13 emits for sm_90: UNDECODED 0.

A disassembler from CUDA 11 (Debian 12's nvidia-cuda-toolkit 11.8) reads sm_90 code but not
the ELF header of cubins from CUDA 12.8 and later, which encode the architecture differently;
the header of a copy is then rewritten to the CUDA 11 encoding (OS/ABI 0x33, ABI version 7,
e_flags SM | SM << 16 | 0x500). The instructions are not touched.
When nothing can be read, OUT holds one line: "# unavailable: WHY".
"""
import heapq
import os
import re
import struct
import subprocess
import sys
import tempfile


def cuda11_header(data):
    """A copy of the cubin `data` with the CUDA 11 ELF header; None when it has that one."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise RuntimeError("not an ELF file")
    if data[7] != 0x41:  # OS/ABI of the CUDA 12.8+ encoding, whose e_flags hold the SM in bits 8..15
        return None
    sm = (struct.unpack_from("<I", data, 48)[0] >> 8) & 0xFF
    patched = bytearray(data)
    patched[7], patched[8] = 0x33, 7
    struct.pack_into("<I", patched, 48, sm | (sm << 16) | 0x500)
    return bytes(patched)


def disassemble(nvdisasm, cubin):
    rc, out, err = run(nvdisasm, cubin)
    if rc == 0:
        return out
    patched = cuda11_header(open(cubin, "rb").read())
    if patched is None:
        raise RuntimeError("nvdisasm failed: " + err.strip()[:200])
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(patched)
    try:
        rc, out, second = run(nvdisasm, f.name)
    finally:
        os.unlink(f.name)
    if rc != 0:
        raise RuntimeError("nvdisasm failed on the cubin and on its CUDA 11 header: " + (err or second).strip()[:200])
    return out


def run(nvdisasm, cubin):
    p = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]*)?\s*(.*?);")
LABEL = re.compile(r"^\.(L_x_\d+):")
TARGET = re.compile(r"\(\.(L_x_\d+)\)")


def kernel_mix(body):
    labels, code = {}, []  # code: (opcode, predicated, operands)
    address, undecoded = None, 0
    for line in body.split("\n"):
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = len(code)
            continue
        m = INSTRUCTION.match(line)
        if m:
            # An address skipped (instructions are 16 bytes) is an instruction the disassembler
            # could not decode and left out (CUDA 11.8's nvdisasm does so with VIADD): counted,
            # as an instruction of unknown kind, where it stood.
            at = int(m.group(1), 16)
            if address is not None and at > address + 16:
                missing = (at - address) // 16 - 1
                undecoded += missing
                code.extend([("UNDECODED", False, "")] * missing)
            address = at
            # BRA.DIV (to the divergent path of a warp-wide operation) is taken only when the
            # warp diverged: a conditional branch although it has no predicate.
            conditional = bool(m.group(2)) or (m.group(3) == "BRA" and ".DIV" in (m.group(4) or ""))
            code.append((m.group(3), conditional, m.group(5)))

    def target(operands):
        t = TARGET.search(operands)
        return labels.get(t.group(1)) if t else None

    best = None  # (mma, -length, head, back edge)
    for i, (op, _, operands) in enumerate(code):
        t = target(operands) if op == "BRA" else None
        if t is not None and t <= i:
            mma = sum(1 for o, _, _ in code[t:i + 1] if o == "HMMA")
            key = (mma, -(i - t), t, i)
            if best is None or key[:2] > best[:2]:
                best = key
    if best is None or best[0] == 0:
        return None
    _, _, head, back = best
    counted = lambda i: 0 if code[i][0] == "NOP" else 1
    static = sum(counted(i) for i in range(head, back + 1))
    static_mma = best[0]
    # Shortest way from the head to the back edge (Dijkstra on instruction counts).
    queue, done = [(counted(head), head, int(code[head][0] == "HMMA"))], set()
    path = None
    while queue:
        length, i, mma = heapq.heappop(queue)
        if i in done:
            continue
        done.add(i)
        if i == back:
            path = (length, mma)
            break
        op, predicated, operands = code[i]
        nexts = []
        if op == "BRA":
            t = target(operands)
            if t is not None and head <= t <= back:
                nexts.append(t)
            if predicated:
                nexts.append(i + 1)
        elif op in ("EXIT", "RET"):
            if predicated:
                nexts.append(i + 1)
        else:
            nexts.append(i + 1)
        for j in nexts:
            if head <= j <= back and j not in done:
                heapq.heappush(queue, (length + counted(j), j, mma + int(code[j][0] == "HMMA")))
    if path is None:
        return None
    return static, static_mma, path[0], path[1], undecoded


SELF_TEST = """
//--------------------- .text.fast_and_slow --------------------------
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   FMUL R2, R2, R3 ;
        /*0040*/                   FMUL R2, R2, R3 ;
.L_x_1:
        /*0050*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0060*/                   NOP ;
        /*0070*/               @P1 BRA `(.L_x_0) ;
.L_x_2:
        /*0080*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0090*/               @P2 BRA `(.L_x_2) ;
        /*00a0*/                   EXIT ;
//--------------------- .text.warp_divergence --------------------------
.L_x_4:
        /*0000*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0010*/                   BRA.DIV UR4, `(.L_x_5) ;
        /*0020*/                   SHFL.BFLY PT, R2, R0, 0x1, 0x1f ;
.L_x_6:
        /*0030*/               @P0 BRA `(.L_x_4) ;
        /*0040*/                   EXIT ;
.L_x_5:
        /*0050*/                   WARPSYNC.ALL ;
        /*0060*/                   BRA `(.L_x_6) ;
//--------------------- .text.gap --------------------------
.L_x_7:
        /*0000*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0030*/                   FADD R2, R2, R3 ;
        /*0040*/               @P0 BRA `(.L_x_7) ;
        /*0050*/                   EXIT ;
//--------------------- .text.no_mma_loop --------------------------
.L_x_3:
        /*0000*/                   FADD R0, R0, R1 ;
        /*0010*/               @P0 BRA `(.L_x_3) ;
        /*0020*/                   EXIT ;
"""


def self_test():
    """Checks the loop finding, the two counts and the header rewrite on made-up input."""
    parts = re.split(r"//-+ \.text\.(\S+) -+\n", SELF_TEST)
    mixes = {parts[i]: kernel_mix(parts[i + 1]) for i in range(1, len(parts), 2)}
    # the MMA loop, not the later one; 6 instructions in its body (the NOP not counted), the
    # fast way skips the two FMULs: 4 instructions, both MMAs; a BRA.DIV (no predicate) falls
    # through to the shuffle when the warp is converged; the two addresses skipped in "gap"
    # (0x10, 0x20: instructions the disassembler left out) count, there and in UNDECODED
    expect = {"fast_and_slow": (6, 2, 4, 2, 0), "warp_divergence": (4, 1, 4, 1, 0), "gap": (5, 1, 5, 1, 2),
              "no_mma_loop": None}
    header = bytearray(64)
    header[:4], header[7], header[8] = b"\x7fELF", 0x41, 8
    struct.pack_into("<I", header, 48, 0x6005A04)
    patched = cuda11_header(bytes(header))
    ok = (mixes == expect and patched[7] == 0x33 and patched[8] == 7 and
          struct.unpack_from("<I", patched, 48)[0] == 0x5A055A and cuda11_header(patched) is None)
    print("sass_mix.py --self-test: %s (%s)" % ("OK" if ok else "FAILED", mixes))
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 4:
        sys.exit("usage: sass_mix.py NVDISASM CUBIN OUT")
    nvdisasm, cubin, out = sys.argv[1:]
    try:
        text = disassemble(nvdisasm, cubin)
        parts = re.split(r"//-+ \.text\.(\S+) -+\n", text)
        lines = []
        for i in range(1, len(parts), 2):
            mix = kernel_mix(parts[i + 1].split("//----")[0])
            if mix:
                lines.append("%s %d %d %d %d %d" % ((parts[i],) + mix))
        if not lines:
            raise RuntimeError("no kernel with a tensor-core loop in the disassembly")
        result = "\n".join(lines) + "\n"
    except Exception as e:  # the figures then say why they are missing; the build goes on
        result = "# unavailable: %s\n" % e
    with open(out, "w") as f:
        f.write(result)


if __name__ == "__main__":
    main()
