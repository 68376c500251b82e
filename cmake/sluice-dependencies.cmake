# Finds what sluice's headers need; used by the source tree and by the installed package.
#   Threads::Threads
#   sluice::asio  (standalone Asio headers, e.g. Debian's libasio-dev)
#   ZLIB::ZLIB    (gzip inflate for the formats; Debian's zlib1g-dev)
#   CURL::libcurl (HTTP for sluice::fetch; Debian's libcurl4-openssl-dev)
#   pugixml::pugixml (S3's XML: listings and error replies; Debian's libpugixml-dev)
#   dlpack::dlpack (the DLPack tensor header, for exporting batches; Debian's libdlpack-dev)
#   CUDA::cudart  (the CUDA runtime, for the CUDA engine; only when SLUICE_CUDA is not OFF
#                 and the CUDA toolkit is found; ON makes it required)
#   sluice::image_libraries (the image layer's, all optional: without one of them there
#                 is no sluice::image): libjpeg-turbo's libjpeg API (JPEG::JPEG; Debian's
#                 libjpeg62-turbo-dev), libspng (libspng-dev) and OpenCV's core and imgproc
#                 for resizing (libopencv-imgproc-dev)
#   sluice::isal  (optional: Intel's ISA-L, whose crc32_iscsi sums TFRecord's CRC-32C
#                 with carry-less multiplies, 1.7-2.8 x sluice's own code; Debian's
#                 libisal-dev. Without it, sluice's own code sums it, as before)
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(ZLIB)
find_dependency(CURL)
find_dependency(pugixml)
find_dependency(dlpack)
if(SLUICE_CUDA STREQUAL "ON")
  find_dependency(CUDAToolkit)
elseif(NOT SLUICE_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
endif()
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

if(NOT TARGET sluice::image_libraries)
  find_package(JPEG QUIET)
  find_path(SLUICE_SPNG_INCLUDE_DIR spng.h)
  find_library(SLUICE_SPNG_LIBRARY spng)
  find_path(SLUICE_OPENCV_INCLUDE_DIR opencv2/imgproc.hpp PATH_SUFFIXES opencv4)
  find_library(SLUICE_OPENCV_CORE_LIBRARY opencv_core)
  find_library(SLUICE_OPENCV_IMGPROC_LIBRARY opencv_imgproc)
  if(TARGET JPEG::JPEG AND SLUICE_SPNG_INCLUDE_DIR AND SLUICE_SPNG_LIBRARY AND SLUICE_OPENCV_INCLUDE_DIR
     AND SLUICE_OPENCV_CORE_LIBRARY AND SLUICE_OPENCV_IMGPROC_LIBRARY)
    add_library(sluice::image_libraries INTERFACE IMPORTED GLOBAL)
    set_target_properties(sluice::image_libraries PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${SLUICE_SPNG_INCLUDE_DIR};${SLUICE_OPENCV_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "JPEG::JPEG;${SLUICE_SPNG_LIBRARY};${SLUICE_OPENCV_IMGPROC_LIBRARY};${SLUICE_OPENCV_CORE_LIBRARY}")
  endif()
endif()

if(NOT TARGET sluice::isal)
  find_path(SLUICE_ISAL_INCLUDE_DIR isa-l/crc.h)
  find_library(SLUICE_ISAL_LIBRARY isal)
  if(SLUICE_ISAL_INCLUDE_DIR AND SLUICE_ISAL_LIBRARY)
    add_library(sluice::isal INTERFACE IMPORTED GLOBAL)
    set_target_properties(sluice::isal PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${SLUICE_ISAL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${SLUICE_ISAL_LIBRARY}"
      INTERFACE_COMPILE_DEFINITIONS SLUICE_HAVE_ISAL=1)
  endif()
endif()
