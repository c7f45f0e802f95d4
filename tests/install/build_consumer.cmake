# cmake -DPREFIX=... -DWORK=... -DSOURCE=... -DGENERATOR=... -DCXX=... -DVERSION=x.y
#       -DCOMPONENTS=a,b -DEXPECT=success|<regex of the configure error> -P build_consumer.cmake
file(REMOVE_RECURSE "${WORK}")
string(REPLACE "," ";" components "${COMPONENTS}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE}" -B "${WORK}" -G "${GENERATOR}"
          "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${PREFIX}"
          "-DBATON_REQUIRED_VERSION=${VERSION}" "-DBATON_COMPONENTS=${COMPONENTS}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(log "${out}${err}")
if(NOT EXPECT STREQUAL "success")
  if(rc EQUAL 0)
    message(FATAL_ERROR "configuring the consumer with version ${VERSION} and components "
                        "'${COMPONENTS}' succeeded but must fail:\n${log}")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${log}")
  if(NOT flat MATCHES "${EXPECT}")
    message(FATAL_ERROR "the consumer failed to configure, but not with a message matching "
                        "'${EXPECT}':\n${log}")
  endif()
  message(STATUS "rejected as expected")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer configure failed:\n${log}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer build failed:\n${out}${err}")
endif()
execute_process(COMMAND "${WORK}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer run failed (${rc}):\n${out}${err}")
endif()
message(STATUS "consumer ran:\n${out}")
