# Installation (`cmake --install`) and the Debian package (`scripts/package.sh`, CPack's DEB generator).
# Paths come from GNUInstallDirs, resolved at configure time: with CMAKE_INSTALL_PREFIX=/usr (what
# scripts/package.sh configures) the binaries go to /usr/bin and the configuration to /etc/dplb; with
# the default /usr/local, to /usr/local/bin and /usr/local/etc/dplb. The systemd unit names those paths.
include(GNUInstallDirs)

install(TARGETS dplb dplb-mock-engine dplb-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(DPLB_CONFIG_DIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/dplb)
install(FILES config/dplb.example.json config/dplb.clusters.example.json DESTINATION ${DPLB_CONFIG_DIR})
# The configuration the unit reads starts as the example (one host, ranks on 8100..8103, dplb on 8000).
# An install never overwrites one that is there; the package marks it a conffile, so dpkg keeps local edits.
install(CODE "
  set(config \"\$ENV{DESTDIR}${DPLB_CONFIG_DIR}/dplb.json\")
  if(NOT EXISTS \"\${config}\")
    message(STATUS \"Installing: \${config}\")
    file(COPY_FILE \"${PROJECT_SOURCE_DIR}/config/dplb.example.json\" \"\${config}\")
  endif()")

# The unit in deploy/systemd names the packaged paths (/usr/bin, /etc/dplb); this install's replace them.
set(DPLB_UNIT_SOURCE ${PROJECT_SOURCE_DIR}/deploy/systemd/dplb.service)
file(READ ${DPLB_UNIT_SOURCE} unit)
string(REPLACE "/usr/bin/dplb" "${CMAKE_INSTALL_FULL_BINDIR}/dplb" unit "${unit}")
string(REPLACE "/etc/dplb/" "${DPLB_CONFIG_DIR}/" unit "${unit}")
file(WRITE ${PROJECT_BINARY_DIR}/dplb.service "${unit}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${DPLB_UNIT_SOURCE})
install(FILES ${PROJECT_BINARY_DIR}/dplb.service DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)

install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md" PATTERN "*.png")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dplb)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "HTTP load balancer for vLLM data-parallel ranks")
set(CPACK_PACKAGE_DESCRIPTION "dplb spreads requests exactly over vLLM engine servers, one per data-parallel rank,
streams every response back unbuffered, and exports per-rank load metrics for Prometheus.")
set(CPACK_PACKAGE_CONTACT "dplb developers <dplb@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# Depends: the shared libraries the binaries link, found by dpkg-shlibdeps (Boost, spdlog, fmt, prometheus-cpp).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Every file under /etc/dplb is a conffile: an upgrade keeps what the admin edited.
file(WRITE ${PROJECT_BINARY_DIR}/debian/conffiles
  "${DPLB_CONFIG_DIR}/dplb.json\n${DPLB_CONFIG_DIR}/dplb.example.json\n${DPLB_CONFIG_DIR}/dplb.clusters.example.json\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/conffiles)
include(CPack)
