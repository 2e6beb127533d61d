// The message header on the wire, as a Channel's ring and a Topic's slots carry it:
//   MsgHeader (32 B) | shape (ndim x u64) | dtype string | zero pad to 64 bytes,
// then the payload. Built by build_msg_header and checked by check_msg_header and
// read_msg_extra, for both.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastcopy {
namespace shm {

constexpr std::uint32_t kMsgMagic = 0x4d534346u;  // "FCSM"
// A Channel's padding record: header_len 64, ndim 0, dtype_len 0, seq = the next message's
// number, payload_len = a multiple of 64 such that the record ends at or before the end of the
// ring; the consumer skips it (see channel.h).
constexpr std::uint32_t kPadMagic = 0x50414446u;  // "FDAP"
constexpr std::uint32_t kMaxNdim = 64;
constexpr std::uint32_t kMaxDtypeLen = 1024;
constexpr std::uint64_t kMaxPayload = std::uint64_t(1) << 46;
constexpr std::size_t kAlign = 64;
// The longest message header: MsgHeader, 64 dimensions and 1024 dtype characters, padded.
constexpr std::size_t kMaxMsgHeaderBytes = (32 + 8 * kMaxNdim + kMaxDtypeLen + kAlign - 1) / kAlign * kAlign;

inline std::size_t pad64(std::size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

struct MsgHeader {          // 32 bytes, at a 64-byte aligned position
    std::uint32_t magic;    // kMsgMagic
    std::uint32_t header_len;  // pad64(32 + 8*ndim + dtype_len)
    std::uint64_t payload_len;
    std::uint32_t dtype_len;
    std::uint32_t ndim;
    std::uint64_t seq;      // message number, 0, 1, 2, ... (detects loss/duplication)
};
static_assert(sizeof(MsgHeader) == 32, "MsgHeader layout");
static_assert(kMaxMsgHeaderBytes == 1600, "the longest message header");

// The dtype text of a message header is 1 to kMaxDtypeLen characters of printable ASCII
// (0x20-0x7e): fastcopy.shm escapes every other character of field names, titles and metadata
// when it describes a dtype. Senders check it before anything is written, receivers again.
inline bool dtype_text_ok(const char* s, std::size_t n) {
    if (n == 0 || n > kMaxDtypeLen) return false;
    for (std::size_t i = 0; i < n; ++i)
        if (static_cast<unsigned char>(s[i]) < 0x20 || static_cast<unsigned char>(s[i]) > 0x7e) return false;
    return true;
}

// A message as a receiver sees it after validation of its header.
struct MsgInfo {
    std::uint64_t payload_len = 0;
    std::uint32_t header_len = 0;
    std::string dtype;
    std::uint32_t ndim = 0;
    std::uint64_t shape[kMaxNdim] = {};
};

// Writes the header of a message of `ndim` dimensions `shape`, dtype text `dtype` (at most
// kMaxDtypeLen characters, checked by the caller) and payload_len bytes into hdr (room for
// kMaxMsgHeaderBytes), seq 0 (the sender numbers it); returns header_len.
std::size_t build_msg_header(std::uint8_t* hdr, std::uint32_t ndim, const std::uint64_t* shape,
                             const std::string& dtype, std::uint64_t payload_len);

// Why the header h of message number `seq` is not a valid message header ("" when it is):
// magic, number, ndim, dtype length, header length, payload length (at most max_payload;
// `payload_limit` names that bound in the reason, e.g. " > slot_bytes 4096").
// `seq_where` words a wrong number: " where N was expected" or " in the slot of N".
std::string check_msg_header(const MsgHeader& h, std::uint64_t seq, const std::string& seq_where,
                             std::uint64_t max_payload, const std::string& payload_limit);

// Reads the shape and dtype that follow a checked header (`extra`: its 8*ndim + dtype_len
// bytes) into info, with the header's lengths; why it is corrupt ("" when it is not): a shape
// whose product overflows, or a dtype that is not printable ASCII.
std::string read_msg_extra(const MsgHeader& h, const std::uint8_t* extra, MsgInfo& info);

}  // namespace shm
}  // namespace fastcopy
