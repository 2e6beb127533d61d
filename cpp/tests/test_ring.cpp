// Tests for the Channel's ring protocol (cpp/shm/channel.cpp, channel_io.cpp) without Python:
// a producer and a consumer Ring of one process on one segment. send/recv, a message that goes to the
// start of the ring behind a padding record or skipping to it, one larger than the ring, a full
// ring's timeout, loans (publish, discard), corrupted head and tail indices, and two threads
// streaming messages up to three times the ring's size with every byte checked. Runs natively
// and under the sanitizers (.ci/cpp_tests.sh). ctest name: ring_tests.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "check.h"
#include "shm/channel.h"

using namespace fastcopy::shm;

namespace {

const GilHooks kNoGil{nullptr, nullptr, nullptr, nullptr};
constexpr std::size_t kCap = 64 * 1024;

// The message header of a 1-D uint8 array of n elements, built as the bindings build it.
struct Header {
    alignas(64) std::uint8_t bytes[kMaxMsgHeaderBytes] = {};
    std::size_t len = 0;
    explicit Header(std::uint64_t n) { len = build_msg_header(bytes, 1, &n, "|u1", n); }
};

// The byte at offset i of message number `seq`.
std::uint8_t pattern(std::uint64_t seq, std::uint64_t i) {
    return static_cast<std::uint8_t>((i * 131 + seq * 7 + (i >> 9)) & 0xff);
}
std::vector<std::uint8_t> payload(std::uint64_t seq, std::size_t n) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = pattern(seq, i);
    return v;
}
bool matches(std::uint64_t seq, const std::uint8_t* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        if (p[i] != pattern(seq, i)) return false;
    return true;
}

std::string name_of(const char* tag) { return "fastcopy-ring-test-" + std::to_string(::getpid()) + "-" + tag; }

// A producer and a consumer on a new segment, unlinked at the end.
struct Pair {
    std::unique_ptr<Ring> prod, cons;
    explicit Pair(const char* tag, std::size_t cap = kCap) {
        const std::string name = name_of(tag);
        prod.reset(Ring::create(name, cap));
        cons.reset(Ring::attach(name));
    }
    ~Pair() {
        prod->unlink();
    }
    std::uint8_t* header_word(std::size_t off) { return prod->ledger()->mapping_ref()->base + off; }
    std::uint64_t head() { return load_acquire_u64(header_word(kOffHead)); }
    bool send(std::uint64_t seq, std::size_t n, double timeout = 1.0) {
        Header h(n);
        const std::vector<std::uint8_t> p = payload(seq, n);
        return prod->send(h.bytes, h.len, p.data(), n, timeout, kNoGil);
    }
    // Receives the next message by copy and checks it is message `seq` of n bytes.
    void recv_copy(std::uint64_t seq, std::size_t n) {
        MsgInfo info;
        CHECK(cons->peek(info, 1.0, kNoGil));
        CHECK(info.payload_len == n && info.ndim == 1 && info.shape[0] == n && info.dtype == "|u1");
        std::vector<std::uint8_t> out(info.payload_len);
        CHECK(cons->consume(info, out.data(), 1.0, kNoGil));
        CHECK(matches(seq, out.data(), out.size()));
    }
};

void send_and_recv() {
    Pair p("basic");
    CHECK(p.send(0, 1000));
    CHECK(p.cons->pending_bytes() == 64 + 1024);
    p.recv_copy(0, 1000);
    CHECK(p.cons->pending_bytes() == 0);
    CHECK(p.send(1, 0));  // an empty payload is a message too
    p.recv_copy(1, 0);
    MsgInfo info;
    CHECK(!p.cons->peek(info, 0.01, kNoGil));  // nothing more: a timeout, nothing consumed
}

void padding_keeps_a_message_whole() {
    Pair p("pad");
    const std::size_t n = 40 * 1024;  // 64 + 40 KiB: the second one would wrap
    CHECK(p.send(0, n));
    p.recv_copy(0, n);
    const std::uint64_t before = p.head();
    CHECK(p.send(1, n));
    // A padding record to the end of the ring, then the message at its start.
    CHECK(p.head() == kCap + 64 + n);
    CHECK(before == 64 + n);
    MsgInfo info;
    CHECK(p.cons->peek(info, 1.0, kNoGil));
    std::uint64_t id = 0;
    bool timed_out = true;
    const std::uint8_t* view = p.cons->take_view(info, 1.0, kNoGil, id, timed_out);
    CHECK(view != nullptr && !timed_out);
    if (view) CHECK(matches(1, view, n));
    CHECK(view == p.cons->ledger()->mapping_ref()->base + kHeaderBytes + 64);  // at the start of the ring
    p.cons->ledger()->release_view(id);
    CHECK(p.cons->pending_bytes() == 0);
}

// A sent message that fits the ring but not in one piece where the head is, with no room for a
// padding record too, waits until the ring is empty and goes to its start: one piece.
void message_skips_to_the_start_of_an_empty_ring() {
    Pair p("skip");
    CHECK(p.send(0, 20 * 1024));
    const std::size_t n = 50 * 1024;
    CHECK(!p.send(1, n, 0.05));  // the ring is not empty: a timeout, nothing reserved
    CHECK(p.head() == 64 + 20 * 1024);
    CHECK(p.cons->pending_bytes() == 64 + 20 * 1024);
    p.recv_copy(0, 20 * 1024);
    CHECK(p.send(1, n));
    CHECK(p.head() == kCap + 64 + n);
    CHECK(p.cons->pending_bytes() == 64 + n);
    MsgInfo info;
    CHECK(p.cons->peek(info, 1.0, kNoGil));
    std::uint64_t id = 0;
    bool timed_out = true;
    const std::uint8_t* view = p.cons->take_view(info, 1.0, kNoGil, id, timed_out);
    CHECK(view == p.cons->ledger()->mapping_ref()->base + kHeaderBytes + 64);  // at the start of the ring
    if (view) CHECK(matches(1, view, n));
    p.cons->ledger()->release_view(id);
    CHECK(p.cons->pending_bytes() == 0);
    for (std::uint64_t seq = 2; seq < 40; ++seq) {  // around the ring many times, sizes varying
        const std::size_t m = (seq * 7919) % (60 * 1024);
        CHECK(p.send(seq, m));
        p.recv_copy(seq, m);
    }
}

// A message larger than the ring streams through it and wraps around its end.
void message_larger_than_the_ring_wraps() {
    Pair p("wrap");
    CHECK(p.send(0, 20 * 1024));
    p.recv_copy(0, 20 * 1024);
    const std::size_t n = 3 * kCap + 4096 + 13;
    std::thread producer([&] { CHECK(p.send(1, n, 10)); });
    MsgInfo info;
    CHECK(p.cons->peek(info, 10, kNoGil));
    std::uint64_t id = 0;
    bool timed_out = true;
    CHECK(p.cons->take_view(info, 1.0, kNoGil, id, timed_out) == nullptr && !timed_out);  // not one piece
    std::vector<std::uint8_t> out(n);
    CHECK(p.cons->consume(info, out.data(), 10, kNoGil));
    CHECK(matches(1, out.data(), n));
    producer.join();
}

void full_ring_times_out() {
    Pair p("full");
    CHECK(p.send(0, 40 * 1024));
    const std::uint64_t head = p.head();
    CHECK(!p.send(1, 40 * 1024, 0.05));  // no room: false, nothing written
    CHECK(p.head() == head);
    std::uint64_t id = 0;
    Header h(40 * 1024);
    CHECK(p.prod->loan(h.bytes, h.len, 40 * 1024, 0.05, kNoGil, id) == nullptr);
    CHECK(p.head() == head);
    p.recv_copy(0, 40 * 1024);
    CHECK(p.send(1, 40 * 1024, 0.05));  // room again
    p.recv_copy(1, 40 * 1024);
}

void loans() {
    Pair p("loan");
    const std::size_t n = 3000;
    Header h(n);
    std::uint64_t id = 0;
    std::uint8_t* slot = p.prod->loan(h.bytes, h.len, n, 1.0, kNoGil, id);
    CHECK(slot != nullptr && id != 0);
    if (!slot) return;
    const std::vector<std::uint8_t> data = payload(0, n);
    std::memcpy(slot, data.data(), n);
    bool refused = false;
    try {
        p.send(9, 10);  // one loan at a time: send() waits for publish or discard
    } catch (const ShmError&) {
        refused = true;
    }
    CHECK(refused);
    CHECK(p.cons->pending_bytes() == 0);  // nothing published yet
    p.prod->publish_loan(id);
    p.recv_copy(0, n);
    // A discarded loan sends nothing; the next message takes its number.
    slot = p.prod->loan(h.bytes, h.len, n, 1.0, kNoGil, id);
    CHECK(slot != nullptr);
    p.prod->ledger()->end_loan(id);
    CHECK(p.cons->pending_bytes() == 0);
    bool stale = false;
    try {
        p.prod->publish_loan(id);
    } catch (const ShmError&) {
        stale = true;
    }
    CHECK(stale);
    CHECK(p.send(1, 100));
    p.recv_copy(1, 100);
    // Loans that would wrap go to the start of the ring, whole.
    for (std::uint64_t seq = 2; seq < 20; ++seq) {
        const std::size_t m = 9000 + seq * 1000;
        Header hm(m);
        std::uint8_t* s = p.prod->loan(hm.bytes, hm.len, m, 1.0, kNoGil, id);
        CHECK(s != nullptr);
        if (!s) return;
        const std::vector<std::uint8_t> d = payload(seq, m);
        std::memcpy(s, d.data(), m);
        p.prod->publish_loan(id);
        MsgInfo info;
        CHECK(p.cons->peek(info, 1.0, kNoGil));
        std::uint64_t vid = 0;
        bool timed_out = true;
        const std::uint8_t* view = p.cons->take_view(info, 1.0, kNoGil, vid, timed_out);
        CHECK(view != nullptr);
        if (view) CHECK(matches(seq, view, m));
        p.cons->ledger()->release_view(vid);
    }
}

// A loan that must go to the start of the ring is granted in an empty ring at once, and one
// that times out reserves nothing.
void loan_in_an_empty_ring_skips() {
    Pair p("loan-skip");
    CHECK(p.send(0, 10 * 1024));
    const std::size_t n = 60 * 1024;
    Header h(n);
    std::uint64_t id = 0;
    CHECK(p.prod->loan(h.bytes, h.len, n, 0.05, kNoGil, id) == nullptr);  // message 0 is unread
    CHECK(p.cons->pending_bytes() == 64 + 10 * 1024);
    p.recv_copy(0, 10 * 1024);
    CHECK(p.cons->pending_bytes() == 0);
    std::uint8_t* slot = p.prod->loan(h.bytes, h.len, n, 0.05, kNoGil, id);
    CHECK(slot != nullptr);
    CHECK(p.cons->pending_bytes() == 0);
    p.prod->ledger()->end_loan(id);  // discarded: nothing sent
    CHECK(p.cons->pending_bytes() == 0);
    slot = p.prod->loan(h.bytes, h.len, n, 0.05, kNoGil, id);
    CHECK(slot != nullptr);
    if (!slot) return;
    const std::vector<std::uint8_t> d = payload(1, n);
    std::memcpy(slot, d.data(), n);
    p.prod->publish_loan(id);
    CHECK(p.cons->pending_bytes() == 64 + n);
    p.recv_copy(1, n);
    CHECK(p.send(2, 100));
    p.recv_copy(2, 100);
}

template <class Fn>
bool corrupted(Fn fn) {
    try {
        fn();
    } catch (const ShmCorrupted&) {
        return true;
    }
    return false;
}

void corrupted_indices_are_detected() {
    {
        Pair p("tail-ahead");
        CHECK(p.send(0, 100));
        store_release_u64(p.header_word(kOffTail), 1 << 20);  // beyond the head
        CHECK(corrupted([&] { p.send(1, kCap - 128, 0.05); }));  // needs room: reads the tail
    }
    {
        Pair p("tail-back");
        CHECK(p.send(0, 100));
        p.recv_copy(0, 100);
        CHECK(p.send(1, 100));
        store_release_u64(p.header_word(kOffTail), 0);  // the consumer's own index, moved back
        MsgInfo info;
        CHECK(corrupted([&] { p.cons->peek(info, 0.05, kNoGil); }));
    }
    {
        Pair p("head-far");
        CHECK(p.send(0, 100));
        p.recv_copy(0, 100);
        store_release_u64(p.header_word(kOffHead), 3 * kCap);  // more than the ring ahead of the tail
        MsgInfo info;
        CHECK(corrupted([&] { p.cons->peek(info, 0.05, kNoGil); }));
    }
    {
        Pair p("head-moved");
        CHECK(p.send(0, 100));
        store_release_u64(p.header_word(kOffHead), 64 * 5);  // the producer's own index, changed
        CHECK(corrupted([&] { p.send(1, 100); }));
    }
    {
        Pair p("bad-message");
        CHECK(p.send(0, 100));
        auto* h = reinterpret_cast<MsgHeader*>(p.header_word(kHeaderBytes));
        h->ndim = kMaxNdim + 1;
        MsgInfo info;
        CHECK(corrupted([&] { p.cons->peek(info, 0.05, kNoGil); }));
    }
}

// A producer thread and a consumer thread: messages from 0 bytes to three times the ring
// (streamed in chunks), sent and loaned, received by copy and by view, every byte checked.
void two_threads_every_byte() {
    Pair p("threads");
    constexpr std::uint64_t kMessages = 400;
    auto size_of = [](std::uint64_t seq) -> std::size_t {
        const std::uint64_t r = (seq * 2654435761u) >> 7;
        switch (seq % 5) {
            case 0: return r % 64;
            case 1: return r % (8 * 1024);
            case 2: return r % (40 * 1024);
            case 3: return kCap + r % (2 * kCap);  // larger than the ring
            default: return r % (20 * 1024);
        }
    };
    std::thread producer([&] {
        for (std::uint64_t seq = 0; seq < kMessages; ++seq) {
            const std::size_t n = size_of(seq);
            if (seq % 3 == 1 && n + kMaxMsgHeaderBytes <= kCap) {
                Header h(n);
                std::uint64_t id = 0;
                std::uint8_t* s = p.prod->loan(h.bytes, h.len, n, -1, kNoGil, id);
                for (std::size_t i = 0; i < n; ++i) s[i] = pattern(seq, i);
                p.prod->publish_loan(id);
            } else {
                CHECK(p.send(seq, n, -1));
            }
        }
    });
    std::uint64_t bad = 0;
    for (std::uint64_t seq = 0; seq < kMessages; ++seq) {
        const std::size_t n = size_of(seq);
        MsgInfo info;
        if (!p.cons->peek(info, -1, kNoGil) || info.payload_len != n) {
            ++bad;
            break;
        }
        const std::uint8_t* view = nullptr;
        std::uint64_t id = 0;
        bool timed_out = false;
        if (seq % 2 == 0) view = p.cons->take_view(info, -1, kNoGil, id, timed_out);
        if (view) {
            if (!matches(seq, view, n)) ++bad;
            p.cons->ledger()->release_view(id);
        } else {
            std::vector<std::uint8_t> out(n);
            if (!p.cons->consume(info, out.data(), -1, kNoGil) || !matches(seq, out.data(), n)) ++bad;
        }
    }
    producer.join();
    CHECK(bad == 0);
    CHECK(p.cons->pending_bytes() == 0);
    CHECK(p.cons->messages_done() == kMessages);
}

}  // namespace

int main() {
    send_and_recv();
    padding_keeps_a_message_whole();
    message_skips_to_the_start_of_an_empty_ring();
    message_larger_than_the_ring_wraps();
    full_ring_times_out();
    loans();
    loan_in_an_empty_ring_skips();
    corrupted_indices_are_detected();
    two_threads_every_byte();
    return checks_passed("ring_tests");
}
