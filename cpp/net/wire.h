// The wire format of fastcopy.net: a numpy array as one Zenoh payload, or as a head and
// pieces, each a Zenoh payload of its own. Built by write_head / write_piece_head and checked by
// parse, for the Publisher and the Subscriber alike; Python reads the layout from
// _core.net_wire_layout() and never restates it.
//
// Layout, version 2, little-endian:
//   head   magic "FCN1" (4)  version u8  kind u8 ('M' a whole message, 'H' the head of one in
//          pieces)  order u8 ('C' or 'F')  ndim u8  dtype_len u8  pad u8  source u64 (the
//          publisher's random id)  seq u64 (its message number, from 0)  nbytes u64 (the
//          array's bytes)                                                          34 bytes
//          shape  ndim x u64
//          dtype  dtype_len bytes of ASCII: numpy's dtype.str (checked by the Python side)
//          data   the array's bytes in its order: all nbytes ('M'), or the first of them ('H',
//                 at least one byte and fewer than nbytes)
//   piece  magic "FCN1"  version u8  kind 'P'  pad 2 bytes  source u64  seq u64  offset u64
//                                                                                  32 bytes
//          data   the array's bytes from offset on
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastcopy {
namespace net {

constexpr char kMagic[4] = {'F', 'C', 'N', '1'};
constexpr std::uint8_t kVersion = 2;
constexpr char kWhole = 'M', kFirst = 'H', kPiece = 'P';
constexpr unsigned kMaxNdim = 32;
constexpr unsigned kMaxDtypeText = 64;

// Byte offsets of the head's fields and of a piece's.
constexpr std::size_t kOffMagic = 0, kOffVersion = 4, kOffKind = 5;
constexpr std::size_t kOffOrder = 6, kOffNdim = 7, kOffDtypeLen = 8;
constexpr std::size_t kOffSource = 10, kOffSeq = 18, kOffNbytes = 26;
constexpr std::size_t kHeadBytes = 34;  // then shape, dtype text, data
constexpr std::size_t kOffPieceSource = 8, kOffPieceSeq = 16, kOffPieceOffset = 24;
constexpr std::size_t kPieceHeadBytes = 32;  // then data

// The bytes of a head before its data.
inline std::size_t head_bytes(unsigned ndim, std::size_t dtype_len) { return kHeadBytes + 8 * ndim + dtype_len; }

// Writes a head (kind kWhole or kFirst) into out (room for head_bytes(ndim, dtype_len)).
void write_head(std::uint8_t* out, char kind, char order, unsigned ndim, const std::uint64_t* shape,
                const char* dtype, std::size_t dtype_len, std::uint64_t source, std::uint64_t seq,
                std::uint64_t nbytes);
// Writes a piece's head into out (room for kPieceHeadBytes).
void write_piece_head(std::uint8_t* out, std::uint64_t source, std::uint64_t seq, std::uint64_t offset);

// A payload as parse finds it.
struct Parsed {
    char kind = 0;               // kWhole, kFirst or kPiece
    std::uint64_t source = 0, seq = 0;
    // A head's:
    char order = 0;
    unsigned ndim = 0;
    std::uint64_t shape[kMaxNdim] = {};
    std::uint64_t count = 0;     // elements: the product of shape
    std::uint64_t nbytes = 0;
    std::size_t dtype_at = 0, dtype_len = 0;
    // A piece's:
    std::uint64_t offset = 0;
    // Both: where the data starts.
    std::size_t data_at = 0;
};

// Checks the payload buf[0:n] and fills `out`. Returns "" for a valid head or piece, else what
// is wrong, in words. A head's element count must not overflow; its data must be exactly
// nbytes (kWhole) or 1 to nbytes - 1 bytes (kFirst). The dtype text, that count x itemsize ==
// nbytes, and whether a piece fits the message it claims are the caller's to check.
std::string parse(const std::uint8_t* buf, std::size_t n, Parsed& out);

}  // namespace net
}  // namespace fastcopy
