#include "net/wire.h"

#include <cstring>

namespace fastcopy {
namespace net {
namespace {

// Little-endian stores and loads, whatever the machine's byte order.
void put_u64(std::uint8_t* p, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint64_t get_u64(const std::uint8_t* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void put_prefix(std::uint8_t* out, char kind) {
    std::memcpy(out + kOffMagic, kMagic, sizeof kMagic);
    out[kOffVersion] = kVersion;
    out[kOffKind] = static_cast<std::uint8_t>(kind);
}

// The shape as Python writes a tuple: "()", "(5,)", "(2, 3)".
std::string shape_text(const Parsed& p) {
    std::string s = "(";
    for (unsigned i = 0; i < p.ndim; ++i) s += (i ? ", " : "") + std::to_string(p.shape[i]);
    return s + (p.ndim == 1 ? ",)" : ")");
}

}  // namespace

void write_head(std::uint8_t* out, char kind, char order, unsigned ndim, const std::uint64_t* shape,
                const char* dtype, std::size_t dtype_len, std::uint64_t source, std::uint64_t seq,
                std::uint64_t nbytes) {
    put_prefix(out, kind);
    out[kOffOrder] = static_cast<std::uint8_t>(order);
    out[kOffNdim] = static_cast<std::uint8_t>(ndim);
    out[kOffDtypeLen] = static_cast<std::uint8_t>(dtype_len);
    out[kOffDtypeLen + 1] = 0;
    put_u64(out + kOffSource, source);
    put_u64(out + kOffSeq, seq);
    put_u64(out + kOffNbytes, nbytes);
    for (unsigned i = 0; i < ndim; ++i) put_u64(out + kHeadBytes + 8 * i, shape[i]);
    std::memcpy(out + kHeadBytes + 8 * ndim, dtype, dtype_len);
}

void write_piece_head(std::uint8_t* out, std::uint64_t source, std::uint64_t seq, std::uint64_t offset) {
    put_prefix(out, kPiece);
    out[kOffKind + 1] = out[kOffKind + 2] = 0;
    put_u64(out + kOffPieceSource, source);
    put_u64(out + kOffPieceSeq, seq);
    put_u64(out + kOffPieceOffset, offset);
}

std::string parse(const std::uint8_t* buf, std::size_t n, Parsed& out) {
    if (n < kPieceHeadBytes)
        return "fastcopy.net: payload of " + std::to_string(n) + " bytes is shorter than a message header";
    if (std::memcmp(buf + kOffMagic, kMagic, sizeof kMagic) != 0)
        return "fastcopy.net: payload does not start with b'FCN1' (a foreign payload on the key)";
    if (buf[kOffVersion] != kVersion)
        return "fastcopy.net: wire format version " + std::to_string(buf[kOffVersion]) +
               ", this fastcopy reads version " + std::to_string(kVersion);
    const char kind = static_cast<char>(buf[kOffKind]);
    out.kind = kind;
    if (kind == kPiece) {
        out.source = get_u64(buf + kOffPieceSource);
        out.seq = get_u64(buf + kOffPieceSeq);
        out.offset = get_u64(buf + kOffPieceOffset);
        out.data_at = kPieceHeadBytes;
        return "";
    }
    if ((kind != kWhole && kind != kFirst) || n < kHeadBytes) return "fastcopy.net: corrupt message header (kind or length)";
    out.order = static_cast<char>(buf[kOffOrder]);
    out.ndim = buf[kOffNdim];
    out.dtype_len = buf[kOffDtypeLen];
    if ((out.order != 'C' && out.order != 'F') || out.ndim > kMaxNdim || out.dtype_len == 0 ||
        out.dtype_len > kMaxDtypeText)
        return "fastcopy.net: corrupt message header (order, ndim or dtype length out of range)";
    out.source = get_u64(buf + kOffSource);
    out.seq = get_u64(buf + kOffSeq);
    out.nbytes = get_u64(buf + kOffNbytes);
    const std::size_t data_at = head_bytes(out.ndim, out.dtype_len);
    if (n < data_at) return "fastcopy.net: truncated message header";
    std::uint64_t count = 1;
    bool overflow = false;
    for (unsigned i = 0; i < out.ndim; ++i) {
        out.shape[i] = get_u64(buf + kHeadBytes + 8 * i);
        overflow = overflow || __builtin_mul_overflow(count, out.shape[i], &count);
    }
    if (overflow) return "fastcopy.net: corrupt message header (the shape's element count overflows)";
    out.count = count;
    out.dtype_at = kHeadBytes + 8 * out.ndim;
    out.data_at = data_at;
    const std::uint64_t held = n - data_at;
    if (kind == kWhole ? held != out.nbytes : !(0 < held && held < out.nbytes))
        return "fastcopy.net: payload holds " + std::to_string(held) + " bytes, header says " +
               std::to_string(out.nbytes) + " for shape " + shape_text(out) +
               (kind == kWhole ? "" : " (the head of a message in pieces)");
    return "";
}

}  // namespace net
}  // namespace fastcopy
