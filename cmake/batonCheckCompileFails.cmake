# Run as: cmake -DCOMPILER=... -DSOURCE=... -DREGEX=... -DFLAGS=a;b -P batonCheckCompileFails.cmake
# Passes only when compiling SOURCE fails AND the diagnostics match REGEX.
execute_process(COMMAND "${COMPILER}" ${FLAGS} "${SOURCE}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must be rejected with an error matching: ${REGEX}")
endif()
if(NOT text MATCHES "${REGEX}")
  message(FATAL_ERROR "${SOURCE} failed to compile, but not with the expected message.\n"
                      "expected (regex): ${REGEX}\n--- compiler output ---\n${text}")
endif()
message(STATUS "rejected as expected: ${CMAKE_MATCH_0}")
