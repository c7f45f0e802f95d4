# Runs baton-train with its defaults, shows its output, and fails unless it exits with 0 and
# the loss fell by at least 40 % ("loss A -> B (N% lower)" with N >= 40).
execute_process(COMMAND "${EXE}" RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "baton-train exited with ${result}")
endif()
if(NOT out MATCHES "\\(([0-9]+)% lower\\)")
  message(FATAL_ERROR "baton-train printed no 'N% lower' summary")
endif()
if(CMAKE_MATCH_1 LESS 40)
  message(FATAL_ERROR "the loss fell by ${CMAKE_MATCH_1}% only; the main job must train (>= 40 %)")
endif()
