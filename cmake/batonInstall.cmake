# Install rules: headers, one export set for the core and one per backend, so that a
# consumer loads (and find_dependency()s) only the components it asks for.
include(CMakePackageConfigHelpers)
set(BATON_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/baton" CACHE STRING
    "Where batonConfig.cmake is installed, relative to the prefix")

install(TARGETS baton EXPORT batonTargets FILE_SET HEADERS)
install(EXPORT batonTargets NAMESPACE baton:: DESTINATION "${BATON_INSTALL_CMAKEDIR}")
foreach(component IN LISTS baton_components)
  string(SUBSTRING "${component}" 0 1 first)
  string(TOUPPER "${first}" first)
  string(SUBSTRING "${component}" 1 -1 rest)
  install(TARGETS baton_${component} EXPORT baton${first}${rest}Targets)
  install(EXPORT baton${first}${rest}Targets NAMESPACE baton:: DESTINATION "${BATON_INSTALL_CMAKEDIR}")
endforeach()

configure_package_config_file(cmake/batonConfig.cmake.in
  "${PROJECT_BINARY_DIR}/batonConfig.cmake" INSTALL_DESTINATION "${BATON_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/batonConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/batonConfig.cmake" "${PROJECT_BINARY_DIR}/batonConfigVersion.cmake"
              cmake/FindNCCL.cmake cmake/batonKokkosFix.cmake
        DESTINATION "${BATON_INSTALL_CMAKEDIR}")
# The documentation, laid out as in the source tree so that the relative links of the
# installed README (docs/*.md, CONTRIBUTING.md) and of docs/ (img/*.svg) resolve:
# <prefix>/share/doc/baton/{README.md, CONTRIBUTING.md, LICENSE, docs/, examples/}.
# tests/install checks every relative link of the installed Markdown files.
install(FILES LICENSE README.md CONTRIBUTING.md DESTINATION "${CMAKE_INSTALL_DOCDIR}")
install(DIRECTORY docs/ DESTINATION "${CMAKE_INSTALL_DOCDIR}/docs")
install(DIRECTORY examples/ DESTINATION "${CMAKE_INSTALL_DOCDIR}/examples")
