# `cmake --install` puts the library, its public headers and a CMake package under the prefix,
# for a project that writes find_package(deuteron) and links deuteron::deuteron. The files the
# library needs at run time are compiled into it (deuteron_embed), so nothing else is installed.
include(CMakePackageConfigHelpers)

set(DEUTERON_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/deuteron)
get_property(DEUTERON_LIBRARIES GLOBAL PROPERTY DEUTERON_LIBRARIES)
install(TARGETS ${DEUTERON_LIBRARIES} EXPORT deuteronTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/deuteron DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT deuteronTargets NAMESPACE deuteron:: DESTINATION ${DEUTERON_PACKAGE_DIR})
configure_package_config_file(cmake/deuteronConfig.cmake.in ${PROJECT_BINARY_DIR}/deuteronConfig.cmake
                              INSTALL_DESTINATION ${DEUTERON_PACKAGE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/deuteronConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/deuteronConfig.cmake ${PROJECT_BINARY_DIR}/deuteronConfigVersion.cmake
        DESTINATION ${DEUTERON_PACKAGE_DIR})
if(DEUTERON_BUILD_CLI)
  install(TARGETS deuteron_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
