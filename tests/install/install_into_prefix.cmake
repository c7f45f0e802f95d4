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
# The documentation (share/doc/baton): the README, the docs and the examples it names, and
# every relative link of the installed Markdown files resolving inside the installed tree.
set(docdir "${PREFIX}/share/doc/baton")
foreach(required README.md CONTRIBUTING.md LICENSE docs/schedules.md docs/img/schedule_zbv.svg
                 examples/custom_schedule/custom_schedule.cpp examples/train_lm/main.cpp)
  if(NOT EXISTS "${docdir}/${required}")
    message(FATAL_ERROR "installed package lacks share/doc/baton/${required}")
  endif()
endforeach()
file(GLOB_RECURSE markdown RELATIVE "${docdir}" "${docdir}/*.md")
set(links_checked 0)
foreach(page IN LISTS markdown)
  file(READ "${docdir}/${page}" text)
  get_filename_component(page_dir "${docdir}/${page}" DIRECTORY)
  # [text](target) where target is a relative path to a file (no scheme, no code). Brackets
  # and semicolons would split or glue CMake list items, so "](" becomes a marker first.
  string(REPLACE "](" "<link>" text "${text}")
  string(REGEX REPLACE "[][;]" " " text "${text}")
  string(REGEX MATCHALL "<link>[A-Za-z0-9_./-]+\\.(md|svg|png|csv|cpp|hpp)[#)]" links "${text}")
  foreach(link IN LISTS links)
    string(REGEX REPLACE "^<link>(.*).$" "\\1" target "${link}")
    if(NOT EXISTS "${page_dir}/${target}")
      message(FATAL_ERROR "installed share/doc/baton/${page} links to ${target}, which is not installed")
    endif()
    math(EXPR links_checked "${links_checked} + 1")
  endforeach()
endforeach()
if(links_checked LESS 10)
  message(FATAL_ERROR "only ${links_checked} relative links found in the installed Markdown files; the link check is broken")
endif()
message(STATUS "installed baton into ${PREFIX} (share/doc/baton: ${links_checked} relative links resolve)")
