// Tests for the shared-memory topic (cpp/shm/topic.cpp) without Python: a publisher thread and
// subscriber threads of one process, each subscriber with its own record. Block mode: every
// subscriber gets every message in order. Drop mode: copies are never torn, views never change,
// and received + lost == published. Also: a fork while another thread holds a slot ledger's
// lock (Channel's or Topic's) leaves the child able to use it. Runs natively and under
// ASan/UBSan (.ci/cpp_tests.sh); not under TSan (the sequence lock reads a slot the publisher
// may be writing, by design, and detects it afterwards). ctest name: topic_tests.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "check.h"
#include "shm/channel.h"
#include "shm/rules.h"
#include "shm/topic.h"

using namespace fastcopy::shm;

namespace {

const Ring::GilHooks kNoGil{nullptr, nullptr, nullptr, nullptr};

// The message header of a 1-D uint64 array of n elements (MsgHeader | shape | "<u8" | pad).
struct Header {
    alignas(64) std::uint8_t bytes[128] = {};
    std::size_t len = 0;
    explicit Header(std::uint64_t n) {
        MsgHeader h{};
        h.magic = kMsgMagic;
        h.ndim = 1;
        h.dtype_len = 3;
        len = pad64(sizeof h + 8 + 3);
        h.header_len = static_cast<std::uint32_t>(len);
        h.payload_len = n * 8;
        std::memcpy(bytes, &h, sizeof h);
        std::memcpy(bytes + sizeof h, &n, 8);
        std::memcpy(bytes + sizeof h + 8, "<u8", 3);
    }
};

std::string name_of(const char* tag) { return "fastcopy-topic-test-" + std::to_string(::getpid()) + "-" + tag; }

void block_mode_fan_out() {
    const std::string name = name_of("block");
    std::unique_ptr<Topic> pub(Topic::create(name, 4096, 8, 0, Overflow::Block, 4));
    std::unique_ptr<Topic> subs[3] = {std::unique_ptr<Topic>(Topic::subscribe(name)),
                                      std::unique_ptr<Topic>(Topic::subscribe(name)),
                                      std::unique_ptr<Topic>(Topic::subscribe(name))};
    CHECK(pub->subscriber_count() == 3);
    constexpr std::uint64_t kCount = 20000;
    std::atomic<int> bad{0};
    std::vector<std::thread> readers;
    for (auto& s : subs) {
        readers.emplace_back([&, t = s.get()] {
            std::vector<std::uint64_t> buf(512);
            for (std::uint64_t k = 0; k < kCount; ++k) {
                TopicMsg m;
                if (!t->next(m, 10.0, kNoGil)) { ++bad; return; }
                std::uint64_t n = m.info.payload_len / 8;
                if (n == 0 || n > buf.size() || m.seq != k) { ++bad; return; }
                t->consume(m, buf.data(), kNoGil);
                for (std::uint64_t i = 0; i < n; ++i)
                    if (buf[i] != k + i) { ++bad; return; }
            }
            TopicMsg m;
            try {
                t->next(m, 10.0, kNoGil);
                ++bad;  // the publisher closed: no further message
            } catch (const ShmClosed&) {
            }
        });
    }
    std::vector<std::uint64_t> msg(512);
    for (std::uint64_t k = 0; k < kCount; ++k) {
        std::uint64_t n = 1 + k % 512;
        for (std::uint64_t i = 0; i < n; ++i) msg[i] = k + i;
        Header h(n);
        CHECK(pub->send(h.bytes, h.len, msg.data(), n * 8, 10.0, kNoGil));
    }
    pub->close();
    for (auto& r : readers) r.join();
    CHECK(bad.load() == 0);
    for (auto& s : subs) s->close();
    pub->unlink();
}

void drop_mode_never_tears() {
    const std::string name = name_of("drop");
    constexpr std::uint64_t kElems = 8192, kCount = 4000;
    std::unique_ptr<Topic> pub(Topic::create(name, kElems * 8, 4, 0, Overflow::Drop, 2));
    std::unique_ptr<Topic> sub(Topic::subscribe(name));
    std::uint64_t received = 0, lost = 0, views = 0;
    int bad = 0;
    std::thread reader([&] {
        std::vector<std::uint64_t> buf(kElems);
        std::uint64_t expected = 0;
        for (;;) {
            TopicMsg m;
            try {
                if (!sub->next(m, 10.0, kNoGil)) { ++bad; return; }
                if (m.seq != expected || m.info.payload_len != kElems * 8) { ++bad; return; }
                if (expected % 13 == 0) {  // a view: pinned, so it never changes while held
                    std::uint64_t id = sub->take_view(m);
                    const auto* p = reinterpret_cast<const std::uint64_t*>(m.payload);
                    for (int pass = 0; pass < 3; ++pass)
                        for (std::uint64_t i = 0; i < kElems; i += 97)
                            if (p[i] != expected) ++bad;
                    sub->ledger()->release_view(id);
                    ++views;
                } else {
                    sub->consume(m, buf.data(), kNoGil);
                    for (std::uint64_t i = 0; i < kElems; ++i)
                        if (buf[i] != expected) { ++bad; break; }
                }
                ++received;
                ++expected;
            } catch (const ShmMessagesLost& e) {
                lost += e.count;
                expected += e.count;
            } catch (const ShmClosed&) {
                return;
            }
        }
    });
    std::vector<std::uint64_t> msg(kElems);
    Header h(kElems);
    for (std::uint64_t k = 0; k < kCount; ++k) {
        for (auto& x : msg) x = k;
        CHECK(pub->send(h.bytes, h.len, msg.data(), kElems * 8, 10.0, kNoGil));
    }
    pub->close();
    reader.join();
    CHECK(bad == 0);
    CHECK(received + lost == kCount);
    CHECK(sub->lost() == lost);
    std::printf("drop mode: %llu received (%llu as views), %llu lost\n", static_cast<unsigned long long>(received),
                static_cast<unsigned long long>(views), static_cast<unsigned long long>(lost));
    sub->close();
    pub->unlink();
}

// A drop-mode topic of `slots` slots of `elems` uint64 values whose subscriber has peeked
// message 0 (next()), for the tests where the publisher laps that slot before the subscriber
// takes the message.
struct PeekedFirst {
    std::string name;
    std::uint32_t slots;
    std::unique_ptr<Topic> pub, sub;
    std::vector<std::uint64_t> msg;
    Header h;
    TopicMsg m;
    int laps = 0;
    PeekedFirst(const char* tag, std::uint64_t elems, std::uint32_t n_slots)
        : name(name_of(tag)), slots(n_slots), pub(Topic::create(name, elems * 8, n_slots, 0, Overflow::Drop, 2)),
          sub(Topic::subscribe(name)), msg(elems, 0), h(elems) {
        CHECK(pub->send(h.bytes, h.len, msg.data(), elems * 8, 1.0, kNoGil));
        CHECK(sub->next(m, 1.0, kNoGil));
        CHECK(m.seq == 0);
    }
    // Publishes messages 1..slots: the last one reuses the slot of message 0.
    void lap() {
        for (std::uint64_t k = 1; k <= slots; ++k) {
            for (auto& x : msg) x = k;
            CHECK(pub->send(h.bytes, h.len, msg.data(), msg.size() * 8, 1.0, kNoGil));
        }
        ++laps;
    }
    // The subscriber lost `lost` messages (at least one) and goes on with an intact message.
    void check_goes_on_after(std::uint64_t lost) {
        CHECK(lost >= 1);
        TopicMsg next;
        CHECK(sub->next(next, 1.0, kNoGil));
        CHECK(next.seq == lost);
        CHECK(sub->ledger()->views() == 0);
    }
    ~PeekedFirst() {
        sub->close();
        pub->unlink();
    }
};

// The publisher overwrites the peeked slot between next() and take_view(): the view must not be
// handed out (its bytes are another message's and would change under the reader). take_view's
// second look at the slot, after it stores its pin, is what catches this; without it the race in
// drop_mode_never_tears is only hit by chance.
void view_of_a_slot_overwritten_after_the_peek_is_refused() {
    PeekedFirst t("view-lapped", 64, 4);
    t.lap();
    std::uint64_t lost = 0;
    try {
        std::uint64_t id = t.sub->take_view(t.m);
        t.sub->ledger()->release_view(id);
    } catch (const ShmMessagesLost& e) {
        lost = e.count;
    }
    t.check_goes_on_after(lost);
}

// The publisher overwrites the slot while the subscriber copies it (drop mode): the copy must
// not be handed out (its bytes are partly another message's). consume()'s second look at the
// slot after the copy is what catches this. A message of kShmReleaseGilBytes or more is copied
// with the GIL released, and the hook that takes it back laps the slot right then, so the race
// in drop_mode_never_tears is hit every time here.
void copy_of_a_slot_overwritten_while_it_is_copied_is_refused() {
    PeekedFirst t("copy-lapped", kShmReleaseGilBytes / 8, 4);
    const Ring::GilHooks hooks{[](void*) {}, [](void* ctx) { static_cast<PeekedFirst*>(ctx)->lap(); }, &t, nullptr};
    std::vector<std::uint64_t> dst(t.msg.size(), ~std::uint64_t(0));
    std::uint64_t lost = 0;
    try {
        t.sub->consume(t.m, dst.data(), hooks);
    } catch (const ShmMessagesLost& e) {
        lost = e.count;
    }
    CHECK(t.laps == 1);
    t.check_goes_on_after(lost);
}

// Another thread holds the ledger's lock (as a thread releasing a view, or moving the
// consumer's tail with the GIL released, does for a moment) when this thread forks. The child
// takes the lock (held_bytes / views) and must not hang: fork() waits until the holder is
// done (ForkSafeMutex), where a plain mutex stayed locked forever in the child. The child
// runs under alarm(): a hang kills it with SIGALRM and fails the check.
template <class Ledger, class UseInChild>
void fork_while_another_thread_holds(const char* what, Ledger& ledger, UseInChild use_in_child) {
    std::atomic<bool> locked{false};
    std::thread holder([&] {
        ledger.mu.lock();
        locked.store(true);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ledger.mu.unlock();
    });
    while (!locked.load()) std::this_thread::yield();
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::alarm(5);
        use_in_child();
        ::_exit(0);
    }
    holder.join();
    int status = 0;
    CHECK(pid > 0 && ::waitpid(pid, &status, 0) == pid);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) std::fprintf(stderr, "%s: the forked child %s\n", what, WIFSIGNALED(status) ? "hung (killed by its alarm)" : "failed");
    CHECK(ok);
}

void fork_while_a_ledger_is_locked() {
    const std::string name = name_of("fork-ledger");
    std::unique_ptr<Ring> ring(Ring::create(name, 1 << 16));
    SlotLedger& ring_ledger = *ring->ledger();
    fork_while_another_thread_holds("Channel ledger", ring_ledger, [&] { (void)ring_ledger.held_bytes(); });
    ring->unlink();

    const std::string topic_name = name_of("fork-topic-ledger");
    std::unique_ptr<Topic> pub(Topic::create(topic_name, 64, 4, 0, Overflow::Block, 2));
    std::unique_ptr<Topic> sub(Topic::subscribe(topic_name));
    TopicLedger& topic_ledger = *sub->ledger();
    fork_while_another_thread_holds("Topic ledger", topic_ledger, [&] { (void)topic_ledger.views(); });
    sub->close();
    pub->unlink();
}

void invalid_geometry_is_rejected() {
    const std::string name = name_of("geometry");
    struct Case { std::uint64_t slot_bytes; std::uint32_t slots, history, max_subs; };
    for (Case c : {Case{64, 1, 0, 2}, Case{64, 4, 4, 2}, Case{0, 4, 0, 2}, Case{64, 4, 0, 0}}) {
        bool threw = false;
        try {
            std::unique_ptr<Topic> t(Topic::create(name, c.slot_bytes, c.slots, c.history, Overflow::Block, c.max_subs));
        } catch (const ShmError&) {
            threw = true;
        }
        CHECK(threw);
        CHECK(::access(("/dev/shm/" + name).c_str(), F_OK) != 0);  // nothing left behind
    }
}

}  // namespace

int main() {
    block_mode_fan_out();
    drop_mode_never_tears();
    view_of_a_slot_overwritten_after_the_peek_is_refused();
    copy_of_a_slot_overwritten_while_it_is_copied_is_refused();
    invalid_geometry_is_rejected();
    fork_while_a_ledger_is_locked();
    return checks_passed("topic_tests");
}
