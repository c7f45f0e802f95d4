# Runs baton-train (EXE) with ARGS (';'-separated) and checks its exit code (EXPECT_CODE) and
# that its output (stdout and stderr) matches every regex in EXPECT (';'-separated).
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${EXE}" ${args} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(NOT result STREQUAL "${EXPECT_CODE}")
  message(FATAL_ERROR "baton-train ${ARGS}: exit code ${result}, expected ${EXPECT_CODE}\n${text}")
endif()
foreach(regex IN LISTS EXPECT)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "baton-train ${ARGS}: the output does not match '${regex}'\n${text}")
  endif()
endforeach()
message("${text}")
