// The parts of the DLPack C ABI (major version 1) that a consumer of the DLPack exchange API
// reads. A producer type publishes `__dlpack_c_exchange_api__`, a PyCapsule named
// "dlpack_exchange_api" that holds a DLPackExchangeAPI; its dltensor_from_py_object_no_sync
// fills a caller's DLTensor for one of the producer's objects without allocating and without
// taking ownership. The layouts below are the standard's (dlpack.h); torch ships that header,
// fastcopy does not build against torch, so the few structs it reads are stated here.
#pragma once
#include <cstdint>

namespace fastcopy::dlpack {

constexpr const char* kExchangeApiCapsule = "dlpack_exchange_api";
constexpr std::uint32_t kMajorVersion = 1;

// DLDeviceType values this consumer tells apart.
constexpr int kDLCPU = 1;

// DLDataTypeCode values.
constexpr std::uint8_t kDLInt = 0;
constexpr std::uint8_t kDLUInt = 1;
constexpr std::uint8_t kDLFloat = 2;
constexpr std::uint8_t kDLComplex = 5;
constexpr std::uint8_t kDLBool = 6;

struct Version {
    std::uint32_t major;
    std::uint32_t minor;
};

struct Device {
    int device_type;  // DLDeviceType, a C enum
    std::int32_t device_id;
};

struct DataType {
    std::uint8_t code;
    std::uint8_t bits;
    std::uint16_t lanes;
};

struct Tensor {
    void* data;
    Device device;
    std::int32_t ndim;
    DataType dtype;
    std::int64_t* shape;    // ndim entries (may be null when ndim is 0)
    std::int64_t* strides;  // ndim entries, in elements; never null from version 1.2 when ndim > 0
    std::uint64_t byte_offset;
};

struct ExchangeApiHeader {
    Version version;
    ExchangeApiHeader* prev_api;
};

// 0 on success; -1 with a Python exception set.
using TensorFromPyObjectNoSync = int (*)(void* py_object, Tensor* out);

struct ExchangeApi {
    ExchangeApiHeader header;
    void* managed_tensor_allocator;
    void* managed_tensor_from_py_object_no_sync;
    void* managed_tensor_to_py_object_no_sync;
    TensorFromPyObjectNoSync dltensor_from_py_object_no_sync;  // may be null
    void* current_work_stream;
};

}  // namespace fastcopy::dlpack
