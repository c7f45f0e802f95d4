# The same training run as MPI processes and as threads: the printed losses (every step, all
# 17 digits) must be the same, bit for bit.
separate_arguments(args UNIX_COMMAND "${ARGS}")
separate_arguments(launch UNIX_COMMAND "${MPIEXEC}")
execute_process(COMMAND ${launch} "${EXE}" --comm mpi ${args} RESULT_VARIABLE mpi_result OUTPUT_VARIABLE mpi_out
                ERROR_VARIABLE mpi_err)
execute_process(COMMAND "${EXE}" --comm local ${args} RESULT_VARIABLE local_result OUTPUT_VARIABLE local_out
                ERROR_VARIABLE local_err)
if(NOT mpi_result EQUAL 0 OR NOT local_result EQUAL 0)
  message(FATAL_ERROR "mpi run: ${mpi_result}\n${mpi_out}${mpi_err}\nlocal run: ${local_result}\n${local_out}${local_err}")
endif()
string(REGEX MATCHALL "loss [0-9.]+" mpi_losses "${mpi_out}")
string(REGEX MATCHALL "loss [0-9.]+" local_losses "${local_out}")
list(LENGTH local_losses n)
if(n EQUAL 0 OR NOT mpi_losses STREQUAL local_losses)
  message(FATAL_ERROR "the losses differ\nmpi:   ${mpi_losses}\nlocal: ${local_losses}")
endif()
message("${n} losses identical over MPI and threads: ${local_losses}")
