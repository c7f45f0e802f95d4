# Checks of baton-torch-pipeline (cmake -DEXE=... [-DARGS=...] [-DMPIEXEC=...] -P check_run.cmake):
#  - always: the run on threads (--comm local ARGS) succeeds and its last step's loss is below
#    its first's;
#  - with MPIEXEC (the launch line): the same run as MPI processes (--comm mpi ARGS) prints the
#    same losses, every step and every digit printed.
# The "loss X" of every "step N | loss X" line of `text`, into `var`.
function(step_losses var text)
  string(REGEX MATCHALL "step +[0-9]+ \\| loss [0-9.]+" steps "${text}")
  string(REGEX MATCHALL "loss [0-9.]+" losses "${steps}")
  set(${var} "${losses}" PARENT_SCOPE)
endfunction()

separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${EXE}" --comm local ${args} RESULT_VARIABLE local_result OUTPUT_VARIABLE local_out
                ERROR_VARIABLE local_err)
if(NOT local_result EQUAL 0)
  message(FATAL_ERROR "local run: ${local_result}\n${local_out}${local_err}")
endif()
step_losses(local_losses "${local_out}")
list(LENGTH local_losses n)
if(n LESS 2)
  message(FATAL_ERROR "expected at least 2 steps' losses, got ${n}:\n${local_out}${local_err}")
endif()
list(GET local_losses 0 first)
list(GET local_losses -1 last)
string(REPLACE "loss " "" first "${first}")
string(REPLACE "loss " "" last "${last}")
if(NOT last LESS first)
  message(FATAL_ERROR "the loss did not fall: ${first} -> ${last}\n${local_out}")
endif()
message("threads: ${n} steps, loss ${first} -> ${last}")

if(DEFINED MPIEXEC AND NOT MPIEXEC STREQUAL "")
  separate_arguments(launch UNIX_COMMAND "${MPIEXEC}")
  execute_process(COMMAND ${launch} "${EXE}" --comm mpi ${args} RESULT_VARIABLE mpi_result OUTPUT_VARIABLE mpi_out
                  ERROR_VARIABLE mpi_err)
  if(NOT mpi_result EQUAL 0)
    message(FATAL_ERROR "mpi run: ${mpi_result}\n${mpi_out}${mpi_err}")
  endif()
  step_losses(mpi_losses "${mpi_out}")
  if(NOT mpi_losses STREQUAL local_losses)
    message(FATAL_ERROR "the losses differ\nmpi:     ${mpi_losses}\nthreads: ${local_losses}")
  endif()
  message("${n} losses identical over MPI and threads: ${local_losses}")
endif()
