// An independent oracle for the model layer: a tiny reverse-mode scalar autodiff in double
// and a naive decoder written with it. Nothing here uses baton's math (no gemm, no attention
// backend, no piece of baton::nn): every product is an explicit loop over scalar nodes,
// attention is a plain softmax over the allowed keys, and every gradient comes from one
// backward sweep over the tape. The tests copy the parameter values of baton's modules into
// it (by the names for_each_parameter prints) and compare outputs and gradients.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oracle {

class tape;

/// A scalar on a tape: the index of its node.
struct var {
  tape* t = nullptr;
  std::uint32_t id = 0;
};

/// The tape: every node's value and up to two parents with the local partial derivatives.
class tape {
 public:
  /// An input (a parameter, a model input): a node without parents.
  var leaf(double value) { return push(value, none, 0.0, none, 0.0); }
  var unary(double value, var a, double da) { return push(value, a.id, da, none, 0.0); }
  var binary(double value, var a, double da, var b, double db) {
    if (a.t != this || b.t != this) throw std::logic_error("oracle::tape: operands from another tape");
    return push(value, a.id, da, b.id, db);
  }

  double value(var x) const { return values_.at(x.id); }
  std::size_t size() const noexcept { return values_.size(); }

  /// d output / d node for every node (the adjoints), by one reverse sweep.
  std::vector<double> backprop(var output) const {
    std::vector<double> adj(values_.size(), 0.0);
    adj.at(output.id) = 1.0;
    for (std::size_t n = static_cast<std::size_t>(output.id) + 1; n-- > 0;) {
      const double g = adj[n];
      if (g == 0.0) continue;
      const node& e = nodes_[n];
      if (e.a != none) adj[e.a] += e.da * g;
      if (e.b != none) adj[e.b] += e.db * g;
    }
    return adj;
  }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
  struct node {
    std::uint32_t a, b;
    double da, db;
  };
  var push(double value, std::uint32_t a, double da, std::uint32_t b, double db) {
    if (values_.size() >= none) throw std::length_error("oracle::tape: too many nodes");
    values_.push_back(value);
    nodes_.push_back(node{a, b, da, db});
    return var{this, static_cast<std::uint32_t>(values_.size() - 1)};
  }

  std::vector<double> values_;
  std::vector<node> nodes_;
};

inline double val(var x) { return x.t->value(x); }

inline var operator+(var a, var b) { return a.t->binary(val(a) + val(b), a, 1.0, b, 1.0); }
inline var operator-(var a, var b) { return a.t->binary(val(a) - val(b), a, 1.0, b, -1.0); }
inline var operator*(var a, var b) { return a.t->binary(val(a) * val(b), a, val(b), b, val(a)); }
inline var operator/(var a, var b) {
  const double bv = val(b);
  return a.t->binary(val(a) / bv, a, 1.0 / bv, b, -val(a) / (bv * bv));
}
inline var operator-(var a) { return a.t->unary(-val(a), a, -1.0); }
inline var operator+(var a, double c) { return a.t->unary(val(a) + c, a, 1.0); }
inline var operator+(double c, var a) { return a + c; }
inline var operator-(var a, double c) { return a.t->unary(val(a) - c, a, 1.0); }
inline var operator-(double c, var a) { return a.t->unary(c - val(a), a, -1.0); }
inline var operator*(var a, double c) { return a.t->unary(val(a) * c, a, c); }
inline var operator*(double c, var a) { return a * c; }
inline var operator/(var a, double c) { return a.t->unary(val(a) / c, a, 1.0 / c); }
inline var operator/(double c, var a) {
  const double av = val(a);
  return a.t->unary(c / av, a, -c / (av * av));
}
inline var exp(var a) {
  const double e = std::exp(val(a));
  return a.t->unary(e, a, e);
}
inline var log(var a) { return a.t->unary(std::log(val(a)), a, 1.0 / val(a)); }
inline var sqrt(var a) {
  const double s = std::sqrt(val(a));
  return a.t->unary(s, a, 0.5 / s);
}
/// The larger operand itself (the gradient flows to the one chosen).
inline var max(var a, var b) { return val(a) >= val(b) ? a : b; }

// ---------------------------------------------------------------------------------------------
// The naive model.

/// The sizes of one block, stated explicitly (nothing derived from baton's config).
struct dims {
  std::int64_t d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  double rope_base = 10000.0;
  double norm_eps = 1e-5;
};

/// Deliberately wrong variants of the oracle, to show that the comparisons can fail.
struct variant {
  bool flip_rope_sign = false;    ///< rotate by -theta
  bool interleaved_gqa = false;   ///< query head h uses kv head h % kv_heads (instead of h / group)
  bool ignore_documents = false;  ///< causal only, even with document ids
};

/// A [rows, cols] matrix of scalars, row-major.
struct mat {
  std::int64_t rows = 0, cols = 0;
  std::vector<var> v;
  var& at(std::int64_t r, std::int64_t c) { return v[static_cast<std::size_t>(r * cols + c)]; }
  const var& at(std::int64_t r, std::int64_t c) const { return v[static_cast<std::size_t>(r * cols + c)]; }
};

inline mat make_mat(std::int64_t rows, std::int64_t cols) {
  mat m;
  m.rows = rows;
  m.cols = cols;
  m.v.resize(static_cast<std::size_t>(rows * cols));
  return m;
}

/// The model's parameters as leaves of a tape, by name, with their gradients after a sweep.
class weights {
 public:
  weights(tape& t, const std::map<std::string, std::vector<double>>& values) {
    for (const auto& [name, vs] : values) {
      std::vector<var>& leaves = leaves_[name];
      leaves.reserve(vs.size());
      for (double x : vs) leaves.push_back(t.leaf(x));
    }
  }

  /// The leaves of parameter `name`, which must hold `size` elements.
  const std::vector<var>& get(const std::string& name, std::int64_t size) {
    const auto it = leaves_.find(name);
    if (it == leaves_.end()) throw std::invalid_argument("oracle: no parameter named \"" + name + "\"");
    if (static_cast<std::int64_t>(it->second.size()) != size)
      throw std::invalid_argument("oracle: parameter \"" + name + "\" has " + std::to_string(it->second.size()) +
                                  " elements, expected " + std::to_string(size));
    used_.insert(name);
    return it->second;
  }
  bool has(const std::string& name) const { return leaves_.count(name) != 0; }

  /// Names of parameters the model never read (a test should find none).
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [name, leaves] : leaves_)
      if (!used_.count(name)) out.push_back(name);
    return out;
  }

  std::map<std::string, std::vector<double>> gradients(const std::vector<double>& adj) const {
    std::map<std::string, std::vector<double>> out;
    for (const auto& [name, leaves] : leaves_) {
      std::vector<double>& g = out[name];
      for (const var& x : leaves) g.push_back(adj[x.id]);
    }
    return out;
  }

 private:
  std::map<std::string, std::vector<var>> leaves_;
  std::set<std::string> used_;
};

inline std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

/// y = x W (+ b), W [in, out] row-major.
inline mat linear(const mat& x, const std::vector<var>& w, std::int64_t out, const std::vector<var>* bias) {
  mat y = make_mat(x.rows, out);
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      var acc = x.at(r, 0) * w[static_cast<std::size_t>(o)];
      for (std::int64_t i = 1; i < x.cols; ++i) acc = acc + x.at(r, i) * w[static_cast<std::size_t>(i * out + o)];
      if (bias) acc = acc + (*bias)[static_cast<std::size_t>(o)];
      y.at(r, o) = acc;
    }
  return y;
}

inline mat linear_named(weights& w, const std::string& prefix, const mat& x, std::int64_t out) {
  const std::vector<var>& weight = w.get(join(prefix, "weight"), x.cols * out);
  const std::string bias_name = join(prefix, "bias");
  const std::vector<var>* bias = w.has(bias_name) ? &w.get(bias_name, out) : nullptr;
  return linear(x, weight, out, bias);
}

/// y = x / sqrt(mean(x^2) + eps) * g, per row.
inline mat rms_norm(const mat& x, const std::vector<var>& gain, double eps) {
  mat y = make_mat(x.rows, x.cols);
  for (std::int64_t r = 0; r < x.rows; ++r) {
    var ss = x.at(r, 0) * x.at(r, 0);
    for (std::int64_t c = 1; c < x.cols; ++c) ss = ss + x.at(r, c) * x.at(r, c);
    const var rms = sqrt(ss / static_cast<double>(x.cols) + eps);
    for (std::int64_t c = 0; c < x.cols; ++c) y.at(r, c) = x.at(r, c) / rms * gain[static_cast<std::size_t>(c)];
  }
  return y;
}

/// RoPE, rotate-half pairing, on x [batch * seq, heads * head_dim]; row (b, s) at position s.
inline mat rope(const mat& x, std::int64_t seq, std::int64_t heads, std::int64_t head_dim, double base,
                const variant& how) {
  mat y = x;
  const std::int64_t half = head_dim / 2;
  const double sign = how.flip_rope_sign ? -1.0 : 1.0;
  for (std::int64_t r = 0; r < x.rows; ++r) {
    const double pos = static_cast<double>(r % seq);
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < half; ++i) {
        const double theta =
            sign * pos * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        const double c = std::cos(theta), s = std::sin(theta);
        const var lo = x.at(r, h * head_dim + i), hi = x.at(r, h * head_dim + half + i);
        y.at(r, h * head_dim + i) = lo * c - hi * s;
        y.at(r, h * head_dim + half + i) = hi * c + lo * s;
      }
  }
  return y;
}

/// Document ids per batch row (empty: no documents).
using documents = std::vector<std::vector<std::int64_t>>;

/// Softmax attention of q [B*S, H*D] over k, v [B*S, KV*D], causal and within documents.
inline mat attention(const mat& q, const mat& k, const mat& v, std::int64_t batch, std::int64_t seq, const dims& d,
                     const documents& docs, const variant& how) {
  const std::int64_t group = d.heads / d.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  mat out = make_mat(batch * seq, d.heads * d.head_dim);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < d.heads; ++h) {
      const std::int64_t kvh = how.interleaved_gqa ? h % d.kv_heads : h / group;
      for (std::int64_t i = 0; i < seq; ++i) {
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < seq; ++j) {
          bool allowed = j <= i;
          if (!docs.empty() && !how.ignore_documents)
            allowed = allowed && docs[static_cast<std::size_t>(b)][static_cast<std::size_t>(i)] ==
                                     docs[static_cast<std::size_t>(b)][static_cast<std::size_t>(j)];
          if (allowed) keys.push_back(j);
        }
        const std::int64_t qi = b * seq + i;
        if (keys.empty()) {  // attends to nothing: zero output (not reached under a causal mask)
          for (std::int64_t e = 0; e < d.head_dim; ++e) out.at(qi, h * d.head_dim + e) = q.v[0].t->leaf(0.0);
          continue;
        }
        std::vector<var> score;
        for (std::int64_t j : keys) {
          const std::int64_t kj = b * seq + j;
          var dot = q.at(qi, h * d.head_dim) * k.at(kj, kvh * d.head_dim);
          for (std::int64_t e = 1; e < d.head_dim; ++e)
            dot = dot + q.at(qi, h * d.head_dim + e) * k.at(kj, kvh * d.head_dim + e);
          score.push_back(dot * scale);
        }
        var m = score[0];
        for (const var& s : score) m = max(m, s);
        std::vector<var> p;
        var den = exp(score[0] - m);
        p.push_back(den);
        for (std::size_t j = 1; j < score.size(); ++j) {
          p.push_back(exp(score[j] - m));
          den = den + p.back();
        }
        for (std::int64_t e = 0; e < d.head_dim; ++e) {
          var acc = p[0] * v.at(b * seq + keys[0], kvh * d.head_dim + e);
          for (std::size_t j = 1; j < keys.size(); ++j) acc = acc + p[j] * v.at(b * seq + keys[j], kvh * d.head_dim + e);
          out.at(qi, h * d.head_dim + e) = acc / den;
        }
      }
    }
  return out;
}

inline mat add(const mat& a, const mat& b) {
  mat y = make_mat(a.rows, a.cols);
  for (std::size_t i = 0; i < a.v.size(); ++i) y.v[i] = a.v[i] + b.v[i];
  return y;
}

/// One pre-norm block: h = x + attn(norm1(x)); y = h + mlp(norm2(h)). `prefix` names its
/// parameters ("layers.0"); the names are those of baton::nn::transformer_block.
inline mat block(weights& w, const std::string& prefix, const mat& x, std::int64_t batch, std::int64_t seq,
                 const dims& d, const documents& docs, const variant& how = {}) {
  const auto p = [&](const std::string& n) { return join(prefix, n); };
  const mat a_in = rms_norm(x, w.get(p("attention_norm.weight"), d.d_model), d.norm_eps);
  const mat q = rope(linear_named(w, p("attention.wq"), a_in, d.heads * d.head_dim), seq, d.heads, d.head_dim,
                     d.rope_base, how);
  const mat k = rope(linear_named(w, p("attention.wk"), a_in, d.kv_heads * d.head_dim), seq, d.kv_heads, d.head_dim,
                     d.rope_base, how);
  const mat v = linear_named(w, p("attention.wv"), a_in, d.kv_heads * d.head_dim);
  const mat o = attention(q, k, v, batch, seq, d, docs, how);
  const mat h = add(x, linear_named(w, p("attention.wo"), o, d.d_model));

  const mat m_in = rms_norm(h, w.get(p("mlp_norm.weight"), d.d_model), d.norm_eps);
  const mat gate = linear_named(w, p("mlp.gate"), m_in, d.ffn_hidden);
  const mat up = linear_named(w, p("mlp.up"), m_in, d.ffn_hidden);
  mat prod = make_mat(gate.rows, gate.cols);
  for (std::size_t i = 0; i < gate.v.size(); ++i) {
    const var z = gate.v[i];
    prod.v[i] = z / (1.0 + exp(-z)) * up.v[i];  // silu(z) = z sigmoid(z)
  }
  return add(h, linear_named(w, p("mlp.down"), prod, d.d_model));
}

/// Mean over counted tokens of logsumexp(z) - z[target], with the row maximum subtracted;
/// targets equal to ignore_index are not counted.
inline var cross_entropy(const mat& logits, const std::vector<std::int64_t>& targets, std::int64_t ignore_index) {
  var total{};
  bool any = false;
  std::int64_t counted = 0;
  for (std::int64_t r = 0; r < logits.rows; ++r) {
    const std::int64_t t = targets[static_cast<std::size_t>(r)];
    if (t == ignore_index) continue;
    var m = logits.at(r, 0);
    for (std::int64_t c = 1; c < logits.cols; ++c) m = max(m, logits.at(r, c));
    var s = exp(logits.at(r, 0) - m);
    for (std::int64_t c = 1; c < logits.cols; ++c) s = s + exp(logits.at(r, c) - m);
    const var token_loss = log(s) + m - logits.at(r, t);
    total = any ? total + token_loss : token_loss;
    any = true;
    ++counted;
  }
  if (!any) throw std::invalid_argument("oracle::cross_entropy: no counted token");
  return total / static_cast<double>(counted);
}

/// embedding "embed.weight" -> blocks "layers.0" ... -> final norm "head.norm.weight" and
/// projection "head.output.weight" -> mean cross-entropy. tokens and targets are [batch * seq].
inline var language_model(weights& w, const std::vector<std::int64_t>& tokens, const std::vector<std::int64_t>& targets,
                          std::int64_t batch, std::int64_t seq, const dims& d, std::int64_t vocab, std::int64_t layers,
                          std::int64_t ignore_index = -100, const documents& docs = {}) {
  const std::vector<var>& table = w.get("embed.weight", vocab * d.d_model);
  mat x = make_mat(batch * seq, d.d_model);
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < d.d_model; ++c)
      x.at(r, c) = table[static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)] * d.d_model + c)];
  for (std::int64_t l = 0; l < layers; ++l) x = block(w, "layers." + std::to_string(l), x, batch, seq, d, docs);
  const mat normed = rms_norm(x, w.get("head.norm.weight", d.d_model), d.norm_eps);
  const mat logits = linear(normed, w.get("head.output.weight", d.d_model * vocab), vocab, nullptr);
  return cross_entropy(logits, targets, ignore_index);
}

}  // namespace oracle
