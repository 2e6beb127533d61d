// The rules of Channel and Topic in words: see rules.h.
#include "shm/rules.h"

#include <cstdio>
#include <string>

#include "policy/store_modes.h"
#include "shm/spin.h"
#include "shm/topic.h"

namespace fastcopy {
namespace shm {

namespace {
// The store-mode rule of loan fills in words, from policy::kSharedWriteRule.
const char* timed_write_rule() {
    const policy::StoreModeRule& r = policy::kSharedWriteRule;
    static const std::string text = [] {
        char b[800];
        std::snprintf(b, sizeof b,
                      "fastcopy.copy into a loan (Channel or Topic) from this size is timed, and each size class "
                      "(256 KiB, 1 MiB, 4 MiB up) uses cached or streaming stores, whichever ran faster lately: "
                      "the other is tried after %u fills, then %ux less often after each loss (up to every %u), and takes over "
                      "when %gx faster (streaming) or %gx (cached); the current one leaves after %u slow fills in "
                      "a row. Not timed: send(), forced kernels, kernels without a streaming twin, fills the "
                      "profile streams already, and page distances its non-temporal rule excludes. "
                      "Channel.store_modes and Topic.store_modes show the state",
                      r.explore_min, r.explore_growth, r.explore_max, r.to_streaming_margin, r.to_cached_margin, r.slow_to_leave);
        return std::string(b);
    }();
    return text.c_str();
}

}  // namespace

std::vector<ShmRule> rules() {
    return {
        {"page_aligned_loan_bytes", double(kPageAlignedLoanMin), "bytes",
         "Channel loans, and Topic slots of slot_bytes, from this size start their payload on a 4096-byte boundary",
         "the copy that fills a loan needs (dst - src) mod 4096 of 0 or at least 512 for non-temporal stores and "
         "Zen 3's rep movsb; 16 MiB fastcopy.copy into a loan took 840 us page-aligned against 1060-1160 us at "
         "page offsets 64-256 (Zen 3 VM, medians of 21 interleaved rounds)"},
        {"early_wrap_bytes", double(kPageAlignedLoanMin), "bytes",
         "a Channel loan from this size goes back to the start of the ring when the start is free and the "
         "consumer is waiting, so consecutive loans reuse recently written memory",
         "16 MiB loans against iceoryx2's view path: one-way throughput 0.97-1.07x with early wraps, "
         "0.89-0.92x without (Zen 3 VM, 5 interleaved pairs of runs)"},
        {"topic_default_bytes", double(kTopicDefaultBytes), "bytes",
         "Topic.create() without slots: as many slots of slot_bytes as hold this much, 4 to 1024, and at "
         "least history + 1",
         "2 subscribers, send + recv(out=): 64 B and 4 KiB messages 1.6-2.1x faster with 1024 slots than with "
         "8; 64 KiB 0.70-0.85x with 4 or 8 slots against 16-128; 1 MiB 0.93-1.58x with 4 slots against 8 "
         "(median 1.19x over 8 runs) and 0.52-0.83x with 32; 16 MiB alike with 2-4 (Zen 3 VM, interleaved runs)"},
        {"pipelined_send_bytes", double(kPipelineBytes), "bytes",
         "send() of a message from this size publishes it in 256 KiB chunks as it is written, so the "
         "consumer's copy-out overlaps the producer's copy-in",
         "from 512 KiB a message is at least two 256 KiB chunks; pipelined against not, round trip "
         "86-174 against 97-233 us at 512 KiB, 143-416 against 260-422 us at 1 MiB, 304-665 against "
         "632-1087 us at 2 MiB, throughput alike within noise (Zen 3 VM, 4 interleaved runs each)"},
        {"release_gil_bytes", double(kShmReleaseGilBytes), "bytes",
         "send() and recv() of a message from this size copy with the GIL released",
         "releasing from 64 KiB instead (copy()'s threshold) gained nothing single-threaded: 64-128 KiB "
         "15-24 against 19-26 GB/s, outliers aside (Zen 3 VM, 4 interleaved runs each, noisy host)"},
        {"timed_write_bytes", double(policy::StoreModeLearner::kMinBytes), "bytes", timed_write_rule(),
         "a slot's lines were read by the other CPU; while the host kept the two vCPUs far apart (cache-line "
         "round trip 290-347 ns) cached 1 MiB writes took 230-540 us and streaming ones 38-56 us; near (52-85 ns) "
         "cached 22-30 us, streaming 38-45 us (Zen 4 VM, 150 hand-offs per variant, interleaved). With "
         "send()'s pieces timed as well (and a 1.25x margin both ways), 1 MiB Channel throughput fell from 12-20 "
         "to 7.6-14 GB/s while far: its consumer copies out while the producer writes, and reading streamed data "
         "cost it more than the producer gained"},
        {"spin_max_seconds", spin_max_seconds(), "seconds",
         "a wait at the start of a message spins (yielding the CPU between polls) for twice its last wait, "
         "at least spin_min_seconds and at most this, before it sleeps; an end whose waits are longer sleeps",
         "waking a halted vCPU cost 60-200 us per message; a loan + view ping-pong took 200-230 us at 64 KiB "
         "sleeping at both ends against 40-60 us spinning (Zen 3 VM, medians of 3 runs)"},
        {"spin_min_seconds", spin_min_seconds(), "seconds",
         "the shortest adaptive spin, and the probe an end that stopped spinning makes once every 64 waits",
         "with this floor, yielding and the sleep rule, a loan + view ping-pong took 40-60 us at 64 KiB and "
         "210-330 us at 1 MiB, against 200-230 and 410 us with a fixed 50 us pure spin (Zen 3 VM, medians of "
         "3 runs)"},
        {"spin_mid_message_seconds", spin_mid_message_seconds(), "seconds",
         "a wait in the middle of a streamed message spins this long before it sleeps",
         "16 MiB sends streamed through an 8 MiB ring: median 12.2 GB/s and 4.1 ms round trip with 10 us, "
         "11.0 GB/s and 4.4 ms without spinning, 11.5 GB/s and 4.2 ms with 50 us (Zen 3 VM, IPC benchmark, "
         "9 interleaved runs each, noisy host, whose spread of 6.7-15 GB/s covers all three)"},
    };
}

}  // namespace shm
}  // namespace fastcopy
