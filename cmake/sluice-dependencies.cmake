# Finds what sluice's headers need; used by the source tree and by the installed package.
#   Threads::Threads
#   sluice::asio  (standalone Asio headers, e.g. Debian's libasio-dev)
#   ZLIB::ZLIB    (gzip inflate for the formats; Debian's zlib1g-dev)
#   CURL::libcurl (HTTP for sluice::fetch; Debian's libcurl4-openssl-dev)
#   pugixml::pugixml (S3's XML: listings and error replies; Debian's libpugixml-dev)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(ZLIB)
find_dependency(CURL)
find_dependency(pugixml)
if(NOT TARGET sluice::asio)
  find_path(SLUICE_ASIO_INCLUDE_DIR asio.hpp DOC "standalone Asio's include directory")
  if(NOT SLUICE_ASIO_INCLUDE_DIR)
    message(FATAL_ERROR "sluice needs standalone Asio (Debian: apt-get install libasio-dev); "
                        "set SLUICE_ASIO_INCLUDE_DIR to the directory holding asio.hpp")
  endif()
  add_library(sluice::asio INTERFACE IMPORTED GLOBAL)
  set_target_properties(sluice::asio PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${SLUICE_ASIO_INCLUDE_DIR}")
  # clang with libstdc++ does not detect coroutine support in Asio 1.22 by itself.
  target_compile_definitions(sluice::asio INTERFACE ASIO_NO_DEPRECATED $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1>)
endif()
