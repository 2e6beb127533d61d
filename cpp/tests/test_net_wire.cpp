// C++ tests of fastcopy.net's wire format (net/wire.h) without Python: heads and pieces written
// and parsed back field for field, and every malformed payload (short, foreign, other version,
// bad kind, order, ndim or dtype length, truncated, overflowing shape, wrong data length)
// refused with its reason; every single-byte change of a head parses to a valid payload or a
// reason, never past the buffer (run under ASan/UBSan too).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "net/wire.h"

using namespace fastcopy::net;

namespace {

std::vector<std::uint8_t> message(char kind, char order, std::vector<std::uint64_t> shape, const std::string& dtype,
                                  std::uint64_t nbytes, std::size_t data_bytes) {
    std::vector<std::uint8_t> buf(head_bytes(static_cast<unsigned>(shape.size()), dtype.size()) + data_bytes, 0xAB);
    write_head(buf.data(), kind, order, static_cast<unsigned>(shape.size()), shape.data(), dtype.data(), dtype.size(),
               0x1122334455667788ull, 42, nbytes);
    return buf;
}

bool refused_with(const std::vector<std::uint8_t>& buf, const char* words) {
    Parsed p;
    const std::string why = parse(buf.data(), buf.size(), p);
    if (why.find(words) == std::string::npos) {
        std::fprintf(stderr, "  expected '%s', got '%s'\n", words, why.c_str());
        return false;
    }
    return true;
}

void test_head_round_trip() {
    auto buf = message(kWhole, 'F', {3, 4}, "<f4", 48, 48);
    CHECK(buf.size() == kHeadBytes + 16 + 3 + 48);
    CHECK(std::memcmp(buf.data(), "FCN1", 4) == 0 && buf[kOffVersion] == kVersion && buf[kOffKind] == 'M');
    CHECK(buf[kOffSource] == 0x88 && buf[kOffSource + 7] == 0x11);  // little-endian
    Parsed p;
    CHECK(parse(buf.data(), buf.size(), p).empty());
    CHECK(p.kind == kWhole && p.order == 'F' && p.ndim == 2 && p.shape[0] == 3 && p.shape[1] == 4);
    CHECK(p.count == 12 && p.nbytes == 48 && p.source == 0x1122334455667788ull && p.seq == 42);
    CHECK(p.dtype_len == 3 && std::memcmp(buf.data() + p.dtype_at, "<f4", 3) == 0);
    CHECK(p.data_at == kHeadBytes + 16 + 3);

    auto zero_d = message(kWhole, 'C', {}, "|b1", 1, 1);
    CHECK(parse(zero_d.data(), zero_d.size(), p).empty() && p.ndim == 0 && p.count == 1);
    auto empty = message(kWhole, 'C', {0, 5}, "<i8", 0, 0);
    CHECK(parse(empty.data(), empty.size(), p).empty() && p.count == 0 && p.data_at == empty.size());
    auto first = message(kFirst, 'C', {100}, "|u1", 100, 40);
    CHECK(parse(first.data(), first.size(), p).empty() && p.kind == kFirst);
}

void test_piece_round_trip() {
    std::vector<std::uint8_t> buf(kPieceHeadBytes + 7, 0xCD);
    write_piece_head(buf.data(), 9, 8, 4096);
    Parsed p;
    CHECK(parse(buf.data(), buf.size(), p).empty());
    CHECK(p.kind == kPiece && p.source == 9 && p.seq == 8 && p.offset == 4096 && p.data_at == kPieceHeadBytes);
}

void test_malformed_payloads_are_refused() {
    const auto good = message(kWhole, 'C', {3, 4}, "<f4", 48, 48);
    CHECK(refused_with(std::vector<std::uint8_t>(good.begin(), good.begin() + kPieceHeadBytes - 1), "shorter than a message header"));
    auto bad = good;
    bad[0] = 'X';
    CHECK(refused_with(bad, "foreign payload"));
    bad = good;
    bad[kOffVersion] = 1;
    CHECK(refused_with(bad, "version 1, this fastcopy reads version 2"));
    bad = good;
    bad[kOffKind] = 'X';
    CHECK(refused_with(bad, "kind or length"));
    CHECK(refused_with(std::vector<std::uint8_t>(good.begin(), good.begin() + kHeadBytes - 1), "kind or length"));
    bad = good;
    bad[kOffOrder] = 'X';
    CHECK(refused_with(bad, "out of range"));
    bad = good;
    bad[kOffNdim] = kMaxNdim + 1;
    CHECK(refused_with(bad, "out of range"));
    bad = good;
    bad[kOffDtypeLen] = 0;
    CHECK(refused_with(bad, "out of range"));
    bad = good;
    bad[kOffDtypeLen] = kMaxDtypeText + 1;
    CHECK(refused_with(bad, "out of range"));
    CHECK(refused_with(std::vector<std::uint8_t>(good.begin(), good.begin() + kHeadBytes + 10), "truncated"));
    CHECK(refused_with(message(kWhole, 'C', {1ull << 40, 1ull << 40}, "<f4", 16, 16), "overflows"));
    CHECK(refused_with(message(kWhole, 'C', {3, 4}, "<f4", 48, 47), "payload holds 47 bytes, header says 48 for shape (3, 4)"));
    CHECK(refused_with(message(kWhole, 'C', {12}, "<f4", 48, 49), "for shape (12,)"));
    CHECK(refused_with(message(kFirst, 'C', {12}, "<f4", 48, 48), "head of a message in pieces"));
    CHECK(refused_with(message(kFirst, 'C', {12}, "<f4", 48, 0), "head of a message in pieces"));
}

void test_every_byte_change_of_a_head_parses_or_is_refused() {
    const auto good = message(kWhole, 'C', {3, 4}, "<f4", 48, 48);
    const std::size_t head = good.size() - 48;
    for (std::size_t i = 0; i < head; ++i) {
        for (int flip : {0x01, 0x80, 0xFF}) {
            auto bad = good;
            bad[i] ^= static_cast<std::uint8_t>(flip);
            // Exactly the payload's bytes: ASan reports any read past them.
            std::vector<std::uint8_t> exact(bad.begin(), bad.end());
            Parsed p;
            const std::string why = parse(exact.data(), exact.size(), p);
            if (!why.empty()) continue;
            CHECK(p.data_at <= exact.size());
            if (p.kind == kWhole) CHECK(p.data_at + p.nbytes == exact.size());
            if (p.kind == kFirst) CHECK(p.data_at + p.nbytes > exact.size() && p.data_at < exact.size());
        }
    }
}

}  // namespace

int main() {
    test_head_round_trip();
    test_piece_round_trip();
    test_malformed_payloads_are_refused();
    test_every_byte_change_of_a_head_parses_or_is_refused();
    return checks_passed("net_wire_tests");
}
