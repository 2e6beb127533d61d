// Message headers: see wire.h.
#include "shm/wire.h"

#include <cstring>

namespace fastcopy {
namespace shm {

std::size_t build_msg_header(std::uint8_t* hdr, std::uint32_t ndim, const std::uint64_t* shape,
                             const std::string& dtype, std::uint64_t payload_len) {
    MsgHeader h{};
    h.magic = kMsgMagic;
    h.ndim = ndim;
    h.dtype_len = static_cast<std::uint32_t>(dtype.size());
    const std::size_t raw = sizeof(MsgHeader) + 8ull * ndim + dtype.size();
    const std::size_t hdr_len = pad64(raw);
    h.header_len = static_cast<std::uint32_t>(hdr_len);
    h.payload_len = payload_len;
    std::memcpy(hdr, &h, sizeof h);
    if (ndim) std::memmove(hdr + sizeof(MsgHeader), shape, 8ull * ndim);
    std::memcpy(hdr + sizeof(MsgHeader) + 8ull * ndim, dtype.data(), dtype.size());
    std::memset(hdr + raw, 0, hdr_len - raw);
    return hdr_len;
}

std::string check_msg_header(const MsgHeader& h, std::uint64_t seq, const std::string& seq_where,
                             std::uint64_t max_payload, const std::string& payload_limit) {
    const std::uint64_t expect_len = pad64(sizeof(MsgHeader) + 8ull * h.ndim + h.dtype_len);
    if (h.magic != kMsgMagic) return "bad message magic";
    if (h.seq != seq) return "message number " + std::to_string(h.seq) + seq_where;
    if (h.ndim > kMaxNdim) return "ndim " + std::to_string(h.ndim) + " > " + std::to_string(kMaxNdim);
    if (h.dtype_len == 0 || h.dtype_len > kMaxDtypeLen) return "dtype length " + std::to_string(h.dtype_len);
    if (h.header_len != expect_len) return "header length " + std::to_string(h.header_len);
    if (h.payload_len > max_payload) return "payload length " + std::to_string(h.payload_len) + payload_limit;
    return "";
}

std::string read_msg_extra(const MsgHeader& h, const std::uint8_t* extra, MsgInfo& info) {
    info.header_len = h.header_len;
    info.payload_len = h.payload_len;
    info.ndim = h.ndim;
    std::uint64_t count = 1;
    for (std::uint32_t i = 0; i < h.ndim; ++i) {
        std::memcpy(&info.shape[i], extra + 8 * i, 8);
        if (info.shape[i] > (std::uint64_t(1) << 62) || __builtin_mul_overflow(count, info.shape[i], &count))
            return "shape overflows";
    }
    info.dtype.assign(reinterpret_cast<const char*>(extra + 8 * h.ndim), h.dtype_len);
    if (!dtype_text_ok(info.dtype.data(), info.dtype.size())) return "dtype string is not printable ASCII";
    return "";
}

}  // namespace shm
}  // namespace fastcopy
