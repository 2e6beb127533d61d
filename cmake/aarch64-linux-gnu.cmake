# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu.
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DFASTCOPY_BUILD_TESTS=ON -DFASTCOPY_STATIC_EXE=ON
# FASTCOPY_STATIC_EXE links executables statically so qemu-aarch64-static can run them
# without an aarch64 sysroot. For the Python module set FASTCOPY_ARM64_ROOT to an aarch64
# root filesystem (mmdebstrap, see notes): headers and libraries are then searched there.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(_fc_triple aarch64-linux-gnu)
find_program(CMAKE_C_COMPILER NAMES ${_fc_triple}-gcc ${_fc_triple}-gcc-12 REQUIRED)
find_program(CMAKE_CXX_COMPILER NAMES ${_fc_triple}-g++ ${_fc_triple}-g++-12 REQUIRED)

option(FASTCOPY_STATIC_EXE "Link executables statically (for qemu user mode)" OFF)
if(FASTCOPY_STATIC_EXE)
  set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
endif()

# Which emulator runs target binaries (used by try_run and by ctest for cross builds).
find_program(_fc_qemu qemu-aarch64-static qemu-aarch64)
if(_fc_qemu)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${_fc_qemu})
endif()

if(DEFINED ENV{FASTCOPY_ARM64_ROOT} AND NOT FASTCOPY_ARM64_ROOT)
  set(FASTCOPY_ARM64_ROOT $ENV{FASTCOPY_ARM64_ROOT})
endif()
if(FASTCOPY_ARM64_ROOT)
  list(APPEND CMAKE_FIND_ROOT_PATH ${FASTCOPY_ARM64_ROOT})
  set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
  set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
  # Debian's multiarch pyconfig.h includes <aarch64-linux-gnu/python3.X/pyconfig.h>: searched
  # after the cross compiler's own headers, so nothing else from the rootfs shadows them.
  set(CMAKE_CXX_FLAGS_INIT "-idirafter ${FASTCOPY_ARM64_ROOT}/usr/include")
endif()
