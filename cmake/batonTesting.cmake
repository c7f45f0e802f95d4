# Helpers that every tests/<layer>/CMakeLists.txt uses. Keep test registration here so the
# sanitizer presets, labels and MPI launch line are decided once.
include_guard(GLOBAL)

option(BATON_TEST_INSTALL "Test the installed package with a consumer project" ON)
option(BATON_CHECK_HEADERS "Compile every public header on its own" ON)
# The tsan preset runs only the tests that run ranks as threads (label "threads"); it builds
# only those, which halves its build.
option(BATON_ONLY_THREAD_TESTS "Build only the tests marked THREADS" OFF)
set(BATON_TEST_TIMEOUT 300 CACHE STRING "Default per-test timeout in seconds")

# Warnings for baton's own targets only; never on baton::baton itself.
set(BATON_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)

function(baton_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${BATON_WARNINGS}>)
endfunction()

# baton_add_test(NAME n SOURCES a.cpp... [LIBS l...] [LABELS l...] [THREADS] [ASAN_SKIPS_IT] [TIMEOUT s] [ARGS a...])
#   One executable, one ctest entry. THREADS marks tests that run ranks (or any work) on
#   several threads: they are the ones the tsan preset runs (label "threads").
#   ASAN_OPTIMIZED: compiled at -O1 by the ASan+UBSan preset (the others at -O0), for a test
#   whose run takes more than a few seconds there.
#   ASAN_SKIPS_IT: not built by the ASan+UBSan preset — for a test that instantiates again,
#   for another policy, code whose memory accesses other tests already check under ASan (the
#   ThreadSanitizer preset still builds it when it is THREADS).
#   SPLIT_TAG tag...: the cases tagged [tag] get their own ctest entry, NAME.tag, with the label
#   tag added (e.g. the issue-28 cases of test_train carry the label "checkpoint", the issue-29
#   ones "memory"); the main entry runs the others.
function(baton_add_test)
  cmake_parse_arguments(arg "THREADS;ASAN_SKIPS_IT;ASAN_OPTIMIZED" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS;SPLIT_TAG" ${ARGN})
  if(BATON_ONLY_THREAD_TESTS AND NOT arg_THREADS)
    return()
  endif()
  if(arg_ASAN_SKIPS_IT AND CMAKE_CXX_FLAGS MATCHES "-fsanitize=address")
    return()
  endif()
  add_executable(${arg_NAME} ${arg_SOURCES})
  set(main baton_test_main)
  if("baton::kokkos" IN_LIST arg_LIBS)
    set(main baton_test_main_kokkos)
  endif()
  target_link_libraries(${arg_NAME} PRIVATE ${main} baton_test_catch Catch2::Catch2 baton::baton ${arg_LIBS})
  target_include_directories(${arg_NAME} PRIVATE "${PROJECT_SOURCE_DIR}/tests/support")
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
    # For the few cases a sanitizer build leaves to the release build (each says why).
    target_compile_definitions(${arg_NAME} PRIVATE BATON_TEST_SANITIZED=1)
  endif()
  # The asan preset compiles at -O0, which halves its compile time (test_nn: 62 -> 32 s of
  # CPU) and finds the same errors; ASAN_OPTIMIZED marks the tests whose run is long enough
  # to need -O1 (test_attention: 54 s at -O1, 299 s at -O0).
  if(arg_ASAN_OPTIMIZED AND CMAKE_CXX_FLAGS MATCHES "-fsanitize=address")
    target_compile_options(${arg_NAME} PRIVATE -O1)
  endif()
  baton_warnings(${arg_NAME})
  baton_skippable_cases(skippable ${arg_SOURCES})
  # One Catch test spec: exclusions written one after the other apply together.
  set(spec "")
  if(skippable)
    string(APPEND spec "~[can-skip]")
  endif()
  foreach(tag IN LISTS arg_SPLIT_TAG)
    string(APPEND spec "~[${tag}]")
  endforeach()
  if(spec)
    add_test(NAME ${arg_NAME} COMMAND ${arg_NAME} ${arg_ARGS} "${spec}")
  else()
    add_test(NAME ${arg_NAME} COMMAND ${arg_NAME} ${arg_ARGS})
  endif()
  set(tests ${arg_NAME})
  foreach(case IN LISTS skippable)
    string(REPLACE "|" ";" case "${case}")
    list(GET case 0 suffix)
    list(GET case 1 tags)
    add_test(NAME ${arg_NAME}.${suffix} COMMAND ${arg_NAME} ${arg_ARGS} --warn NoTests "${tags}")
    list(APPEND tests ${arg_NAME}.${suffix})
  endforeach()
  set(labels ${arg_LABELS})
  if(arg_THREADS)
    list(APPEND labels threads)
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${BATON_TEST_TIMEOUT})
  endif()
  # One BLAS thread per process: ranks run as threads already occupy the cores, and a
  # threaded BLAS under them only oversubscribes (see baton/nn/detail/gemm.hpp).
  set_tests_properties(${tests} PROPERTIES LABELS "${labels}" TIMEOUT ${arg_TIMEOUT}
                       SKIP_REGULAR_EXPRESSION "SKIPPED:" ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  foreach(tag IN LISTS arg_SPLIT_TAG)
    # A [can-skip] case runs in its own entry only (above), never also inside this one.
    set(tag_spec "[${tag}]")
    if(skippable)
      string(APPEND tag_spec "~[can-skip]")
    endif()
    add_test(NAME ${arg_NAME}.${tag} COMMAND ${arg_NAME} ${arg_ARGS} "${tag_spec}")
    set_tests_properties(${arg_NAME}.${tag} PROPERTIES LABELS "${labels};${tag}"
                         TIMEOUT ${arg_TIMEOUT} SKIP_REGULAR_EXPRESSION "SKIPPED:" ENVIRONMENT "OPENBLAS_NUM_THREADS=1")
  endforeach()
endfunction()

# baton_skippable_cases(out sources...)
#   The test cases of the sources tagged [can-skip] (tests/support/skip.hpp), as "suffix|tags"
#   items: each gets its own ctest entry, selected by all of its tags, so that its skip is
#   reported as that case's skip and hides no sibling's verdict.
function(baton_skippable_cases out)
  set(found)
  foreach(source IN LISTS ARGN)
    get_filename_component(path "${source}" ABSOLUTE)
    file(STRINGS "${path}" lines REGEX "TEST_CASE\\(.*\\[can-skip\\]")
    foreach(line IN LISTS lines)
      string(REGEX MATCH "\"(\\[[^\"]*\\[can-skip\\][^\"]*)\"" matched "${line}")
      set(tags "${CMAKE_MATCH_1}")
      string(REGEX REPLACE "\\[can-skip\\]" "" suffix "${tags}")
      string(REGEX REPLACE "\\]\\[" "_" suffix "${suffix}")
      string(REGEX REPLACE "[][]" "" suffix "${suffix}")
      list(APPEND found "${suffix}|${tags}")
    endforeach()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${path}")
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# baton_add_mpi_test(NAME n SOURCES a.cpp... [LIBS ...] [LABELS ...] NP 2 4)
#   One executable with the MPI Catch main, one ctest entry per rank count (n_np2, ...),
#   labelled "mpi". Runs as root and oversubscribed, as the CI machines need.
function(baton_add_mpi_test)
  cmake_parse_arguments(arg "NOT_SANITIZED" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;NP" ${ARGN})
  if(NOT TARGET baton::mpi)
    return()
  endif()
  # NOT_SANITIZED: a higher layer's parity over MPI, built in the release stage only. The
  # sanitizer builds check the same layer over the local world and the MPI communicator
  # itself (tests/comm, tests/reliability); compiling these again under ASan cost ~4 minutes
  # of the CI budget for no code path of baton's own that the others miss.
  if(arg_NOT_SANITIZED AND CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
    return()
  endif()
  add_executable(${arg_NAME} ${arg_SOURCES})
  target_link_libraries(${arg_NAME} PRIVATE baton_test_mpi_main baton_test_catch Catch2::Catch2 baton::mpi ${arg_LIBS})
  target_include_directories(${arg_NAME} PRIVATE "${PROJECT_SOURCE_DIR}/tests/support")
  baton_warnings(${arg_NAME})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${BATON_TEST_TIMEOUT})
  endif()
  baton_skippable_cases(skippable ${arg_SOURCES})
  foreach(np IN LISTS arg_NP)
    set(launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
               --allow-run-as-root --bind-to none ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${arg_NAME}> ${MPIEXEC_POSTFLAGS})
    set(tests ${arg_NAME}_np${np})
    if(skippable)
      add_test(NAME ${arg_NAME}_np${np} COMMAND ${launch} "~[can-skip]")
    else()
      add_test(NAME ${arg_NAME}_np${np} COMMAND ${launch})
    endif()
    foreach(case IN LISTS skippable)
      string(REPLACE "|" ";" case "${case}")
      list(GET case 0 suffix)
      list(GET case 1 tags)
      add_test(NAME ${arg_NAME}_np${np}.${suffix} COMMAND ${launch} --warn NoTests "${tags}")
      list(APPEND tests ${arg_NAME}_np${np}.${suffix})
    endforeach()
    set_tests_properties(${tests} PROPERTIES
      LABELS "mpi;${arg_LABELS}" TIMEOUT ${arg_TIMEOUT} PROCESSORS ${np}
      SKIP_REGULAR_EXPRESSION "SKIPPED:"
      # OpenMPI keeps process-lifetime allocations LeakSanitizer would report; the
      # shared-memory transport needs no network interface.
      ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;OMPI_MCA_btl=self,vader;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endfunction()

# baton_add_compile_fail_test(NAME n SOURCE f.cpp REGEX "re" [FLAGS ...])
#   The source must fail to compile and the compiler's output must match REGEX, so that
#   the test checks the error says what it should (not merely that something broke).
function(baton_add_compile_fail_test)
  cmake_parse_arguments(arg "" "NAME;SOURCE;REGEX" "FLAGS;LABELS" ${ARGN})
  get_filename_component(source "${arg_SOURCE}" ABSOLUTE)
  add_test(NAME ${arg_NAME}
           COMMAND ${CMAKE_COMMAND}
                   "-DCOMPILER=${CMAKE_CXX_COMPILER}"
                   "-DSOURCE=${source}"
                   "-DREGEX=${arg_REGEX}"
                   "-DFLAGS=-std=c++20;-fsyntax-only;-I${PROJECT_SOURCE_DIR}/include;${arg_FLAGS}"
                   -P "${PROJECT_SOURCE_DIR}/cmake/batonCheckCompileFails.cmake")
  set_tests_properties(${arg_NAME} PROPERTIES LABELS "compile_fail;${arg_LABELS}" TIMEOUT 120)
endfunction()

# baton_add_docs_test()
#   The one documentation check (label "docs"; call it once, from tests/CMakeLists.txt):
#   every ```cpp block of README.md, docs/*.md and the comments of include/baton/ must be a
#   "// [doc:NAME]" ... "// [/doc:NAME]" region of a compiled test source under tests/ or
#   examples/, and a program's output shown after it must be asserted by that test
#   ("// [doc-output:NAME]"). See cmake/batonCheckDocs.cmake. It prints how many blocks it
#   found compiled (ctest -L docs -V). A second test, docs_check_selftest (label
#   "selftest"), runs the check on small trees that must pass and fail.
function(baton_add_docs_test)
  add_test(NAME docs_code_blocks_compiled
           COMMAND ${CMAKE_COMMAND} "-DROOT=${PROJECT_SOURCE_DIR}" -P "${PROJECT_SOURCE_DIR}/cmake/batonCheckDocs.cmake")
  set_tests_properties(docs_code_blocks_compiled PROPERTIES LABELS docs TIMEOUT 120)
  add_test(NAME docs_check_selftest
           COMMAND ${CMAKE_COMMAND} "-DCHECK=${PROJECT_SOURCE_DIR}/cmake/batonCheckDocs.cmake"
                   "-DWORK=${PROJECT_BINARY_DIR}/docs_check_selftest"
                   -P "${PROJECT_SOURCE_DIR}/cmake/batonCheckDocsSelfTest.cmake")
  set_tests_properties(docs_check_selftest PROPERTIES LABELS selftest TIMEOUT 120)
endfunction()

# baton_add_compile_fail_dir(DIR fail PREFIX name [LABELS ...])
#   One compile-fail test per DIR/*.cpp, named PREFIX_<stem>. Each file carries its expected
#   diagnostic as a regex on a "// build error: " line (';' written '.', as CMake lists split
#   on it; parentheses written '.').
function(baton_add_compile_fail_dir)
  cmake_parse_arguments(arg "" "DIR;PREFIX" "LABELS" ${ARGN})
  # What these check (a static_assert's message) does not depend on sanitizer flags: the
  # release stage runs them, the sanitizer stages would only compile the same failures again.
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
    return()
  endif()
  file(GLOB sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${arg_DIR}/*.cpp")
  foreach(source IN LISTS sources)
    get_filename_component(stem "${source}" NAME_WE)
    file(STRINGS "${source}" regex_line REGEX "^// build error: ")
    if(NOT regex_line)
      message(FATAL_ERROR "${source} has no '// build error: <regex>' line")
    endif()
    string(REGEX REPLACE "^// build error: " "" regex "${regex_line}")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${source}")  # re-read an edited regex
    baton_add_compile_fail_test(NAME ${arg_PREFIX}_${stem} SOURCE "${source}" REGEX "${regex}" LABELS ${arg_LABELS})
  endforeach()
endfunction()
