# cmake -DBUILD=<build dir> -DPREFIX=<empty prefix> -P install_into_prefix.cmake
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed:\n${out}${err}")
endif()
foreach(required share/cmake/baton/batonConfig.cmake share/cmake/baton/batonConfigVersion.cmake
                 share/cmake/baton/FindNCCL.cmake include/baton/config.hpp)
  if(NOT EXISTS "${PREFIX}/${required}")
    message(FATAL_ERROR "installed package lacks ${required}")
  endif()
endforeach()
message(STATUS "installed baton into ${PREFIX}")
