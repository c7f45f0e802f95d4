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
install(FILES LICENSE README.md DESTINATION "${CMAKE_INSTALL_DOCDIR}")
