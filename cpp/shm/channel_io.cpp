// The Channel's message paths: send, peek, consume, loans and views (channel.cpp has the rest
// of the ring; channel.h the layout and the rules).
#include "shm/channel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

namespace fastcopy {
namespace shm {

bool Ring::send(void* hdr, std::size_t hdr_len, const void* payload, std::size_t payload_len,
                double timeout_s, const GilHooks& hooks) {
    BusyGuard busy(*this);
    claim(Role::Producer);
    check_header();
    check_abandoned();
    if (load_acquire_u32(word(kOffConsClosed)) != 0)
        throw ShmClosed("the consumer closed the channel; the message would never be read");
    if (hdr_len % kAlign != 0 || hdr_len == 0 || hdr_len > cap_ / 4)
        throw ShmError("internal error: message header length " + std::to_string(hdr_len));
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (ledger_->loan_id != 0)
            throw ShmError("a loaned array is outstanding on this channel: publish() or discard() it before send()");
    }
    static_cast<MsgHeader*>(hdr)->seq = seq_;
    if (payload_len > kMaxPayload) throw ShmError("message too large (more than 64 TiB)");
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity()
                                          : monotonic_seconds() + timeout_s;
    const std::uint64_t body = pad64(payload_len);
    const std::uint64_t total = hdr_len + body;
    const auto* hdr_bytes = static_cast<const std::uint8_t*>(hdr);
    const auto* pay = static_cast<const std::uint8_t*>(payload);
    GilGuard gil(hooks);
    std::uint64_t msg_start = head_;  // moves past the padding record, if one goes first
    // Copies logical message bytes [a, end) (header, payload; padding is skipped) to the ring.
    auto write_logical = [&](std::uint64_t a, std::uint64_t end) {
        if (a < hdr_len) {
            std::uint64_t m = std::min<std::uint64_t>(end, hdr_len) - a;
            copy_in(msg_start + a, hdr_bytes + a, m);
            a += m;
        }
        if (a < end && a - hdr_len < payload_len) {
            std::uint64_t pa = a - hdr_len;
            std::uint64_t m = std::min<std::uint64_t>(end - hdr_len, payload_len) - pa;
            copy_in(msg_start + a, pay + pa, m);
        }
    };
    auto advance = [&](std::uint64_t written) {
        head_ = msg_start + written;
        if (written == total) {
            ++seq_;
            store_release_u64(word(kOffProdSeq), seq_);
        }
        publish_head(head_);
    };
    if (total <= cap_) {
        // A message that would wrap around the end of the ring goes to its start instead,
        // behind a padding record, when both fit in the ring (always, up to half the ring):
        // then recv_view() returns it in place instead of a copy, and both copies are one
        // piece. The padding is published with the message's first bytes, never alone.
        // evidence: shm-send-wrap-padding
        // One that fits the ring but not beside a padding record waits until the ring is
        // empty and goes to its start without one (skip_to_lap_start).
        const std::uint64_t to_end = cap_ - head_ % cap_;
        const std::uint64_t pad = total > to_end && to_end + total <= cap_ ? to_end : 0;
        const bool skip = total > to_end && !pad;
        const std::uint64_t need = skip ? cap_ : pad + total;
        // Atomic: wait for room for the whole message (so a timeout leaves nothing half
        // sent), then write it. Large messages are published in chunks as they are written,
        // so the consumer copies out while we copy in.
        if (cap_ - (head_ - tail_) < need) {
            read_tail_checked();
            if (cap_ - (head_ - tail_) < need && wait(kSpace, need, deadline, hooks, kSpinStart) != 0)
                return false;
        }
        if (pad) {
            put_padding(head_, pad);
            msg_start = head_ + pad;
        } else if (skip) {
            skip_to_lap_start();
            msg_start = head_;
        }
        if (payload_len >= kShmReleaseGilBytes) gil.release();
        const std::uint64_t step = payload_len >= kPipelineBytes ? stream_chunk() : total;
        for (std::uint64_t w = 0; w < total;) {
            std::uint64_t n = std::min(step, total - w);
            write_logical(w, w + n);
            w += n;
            advance(w);
        }
        check_abandoned();  // the consumer gave up meanwhile: this message will not be read
        return true;
    }
    // Streamed: the message is larger than the ring. Write it in chunks as room frees up and
    // publish each chunk. A timeout or a signal in the middle cuts the message (cut_message),
    // so another streamed message waits until the consumer skipped the last cut.
    gil.release();
    if (cut_at_ != 0 && !wait_cut_skipped(deadline, hooks, gil.released)) return false;
    const std::uint64_t chunk = stream_chunk();
    std::uint64_t written = 0;
    while (written < total) {
        std::uint64_t remaining = total - written;
        std::uint64_t want = std::min(chunk, remaining);
        if (cap_ - (head_ - tail_) < want) {
            read_tail_checked();
            if (cap_ - (head_ - tail_) < want) {
                int r;
                try {
                    r = wait(kSpace, want, deadline, hooks, written ? spin_mid_message_seconds() : kSpinStart, gil.released);
                } catch (const ShmInterrupted&) {
                    if (written) cut_message();
                    throw;
                } catch (const ShmError& e) {
                    if (written) abandon_message(std::string("a send failed in the middle of a message: ") + e.what());
                    throw;
                }
                if (r != 0) {
                    if (written == 0) return false;
                    cut_message();
                    throw ShmTimeout("send timed out in the middle of a message larger than the ring: the "
                                     "consumer skips what was written of it, nothing of it is received, and the "
                                     "channel goes on");
                }
            }
        }
        // Whole multiples of 64 bytes (`want` is one, and the room is at least `want`), so a cut
        // lies on a message boundary.
        std::uint64_t n = std::min<std::uint64_t>({(cap_ - (head_ - tail_)) & ~std::uint64_t(kAlign - 1), remaining, chunk});
        write_logical(written, written + n);
        written += n;
        advance(written);
    }
    check_abandoned();
    return true;
}

bool Ring::peek(MsgInfo& info, double timeout_s, const GilHooks& hooks) {
    BusyGuard busy(*this);
    claim(Role::Consumer);
    check_header();
    peeked_ = false;
    if (partial_.active) {
        if (const std::uint64_t at = cut_in(partial_.start, partial_.end)) {
            partial_.active = false;  // the producer gave it up meanwhile: go on with the next one
            skip_to_cut(at);
        } else {
            info = partial_.info;
            peeked_ = true;
            peeked_hdr_ = info.header_len;
            peeked_payload_ = info.payload_len;
            return true;
        }
    }
    if (tail_ % kAlign != 0) broken("channel header is corrupt: tail index is not at a message boundary");
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity()
                                          : monotonic_seconds() + timeout_s;
    MsgHeader h;
    for (;;) {
        follow_skip(head_);
        if (head_ - tail_ < kAlign) {
            read_head_checked();
            if (head_ - tail_ < kAlign && wait(kData, kAlign, deadline, hooks, kSpinStart) != 0) return false;
        }
        std::memcpy(&h, data() + tail_ % cap_, sizeof h);  // 64-aligned position: never wraps
        if (h.magic != kPadMagic) {
            // A message the producer cut (cut_message): skip the part of it that was written.
            if (h.magic == kMsgMagic && h.payload_len <= kMaxPayload) {
                if (const std::uint64_t at = cut_in(tail_, tail_ + h.header_len + pad64(h.payload_len))) {
                    skip_to_cut(at);
                    continue;
                }
            }
            break;
        }
        // A padding record (before a loan that would have wrapped, or one whose payload starts
        // on a page): a multiple of 64 bytes that ends at or before the end of the ring, and
        // published whole; then it is skipped.
        const std::uint64_t to_end = cap_ - tail_ % cap_;
        if (h.header_len != kAlign || h.ndim != 0 || h.dtype_len != 0 || h.seq != seq_ ||
            h.payload_len % kAlign != 0 || h.payload_len > to_end - kAlign)
            broken("message header is corrupt: bad padding record");
        const std::uint64_t skip = h.payload_len + kAlign;
        if (head_ - tail_ < skip) {
            read_head_checked();
            if (head_ - tail_ < skip) broken("message header is corrupt: padding record not published whole");
        }
        tail_ += skip;
        publish_tail(tail_);
    }
    const std::string why =
        check_msg_header(h, seq_, " where " + std::to_string(seq_) + " was expected", kMaxPayload, "");
    if (!why.empty()) broken("message header is corrupt: " + why);
    if (head_ - tail_ < h.header_len) {
        // A producer publishes a message header whole (its first chunk holds it), so fewer
        // published bytes than header_len means the header is not what it claims to be.
        read_head_checked();
        if (head_ - tail_ < h.header_len)
            broken("message header is corrupt: header length " + std::to_string(h.header_len) +
                   " is more than the bytes published");
    }
    std::uint8_t extra[8 * kMaxNdim + kMaxDtypeLen];
    std::size_t extra_len = 8ull * h.ndim + h.dtype_len;
    std::size_t pos = static_cast<std::size_t>((tail_ + sizeof(MsgHeader)) % cap_);
    std::size_t first = std::min(extra_len, cap_ - pos);
    std::memcpy(extra, data() + pos, first);
    if (extra_len > first) std::memcpy(extra + first, data(), extra_len - first);
    const std::string bad = read_msg_extra(h, extra, info);
    if (!bad.empty()) broken("message header is corrupt: " + bad);
    peeked_ = true;
    peeked_hdr_ = h.header_len;
    peeked_payload_ = h.payload_len;
    return true;
}

bool Ring::consume(const MsgInfo& info, void* dst, double timeout_s, const GilHooks& hooks) {
    BusyGuard busy(*this);
    claim(Role::Consumer);
    if (!peeked_ || info.payload_len != peeked_payload_ || info.header_len != peeked_hdr_)
        throw ShmError("internal error: consume() without a matching peek()");
    peeked_ = false;
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity()
                                          : monotonic_seconds() + timeout_s;
    const std::uint64_t payload_len = peeked_payload_;
    const std::uint64_t body = pad64(payload_len);
    const std::uint64_t chunk = stream_chunk();
    auto* out = static_cast<std::uint8_t*>(dst);
    const bool resume = partial_.active;
    const std::uint64_t msg_start = resume ? partial_.start : tail_;
    const std::uint64_t msg_end = resume ? partial_.end : tail_ + peeked_hdr_ + body;
    std::uint64_t done = resume ? partial_.done : 0;
    partial_.active = false;
    if (!resume) tail_ += peeked_hdr_;
    // While this message is read, a cut of it ends a wait for data (see wait()).
    struct Watch {
        Ring& r;
        Watch(Ring& ring, std::uint64_t start, std::uint64_t end) : r(ring) { r.watch_start_ = start; r.watch_end_ = end; }
        ~Watch() { r.watch_start_ = r.watch_end_ = 0; }
    } watch(*this, msg_start, msg_end);
    GilGuard gil(hooks);
    if (payload_len >= kShmReleaseGilBytes) gil.release();
    // A timeout or a signal keeps the place in this message for the next recv (resuming()).
    auto keep_place = [&] {
        partial_.active = true;
        partial_.info = info;
        partial_.done = done;
        partial_.start = msg_start;
        partial_.end = msg_end;
        peeked_ = false;
    };
    while (done < body) {
        if (head_ == tail_) {
            read_head_checked();
            if (head_ == tail_) {
                publish_tail(tail_);  // let a streaming producer continue
                gil.release();
                int r;
                try {
                    r = wait(kData, 1, deadline, hooks, spin_mid_message_seconds(), gil.released);
                } catch (const ShmInterrupted&) {
                    keep_place();
                    throw;
                } catch (const ShmError& e) {
                    abandon_message(std::string("a recv failed in the middle of a message: ") + e.what());
                    throw;
                }
                if (r != 0) {
                    keep_place();
                    throw ShmTimeout("recv timed out in the middle of a message larger than the ring: the next recv "
                                     "goes on with it, nothing is lost");
                }
            }
        }
        // The bytes up to head_ are this message's unless the producer cut it: it stores the
        // cut before it publishes a head past it, so a head read past the cut shows the cut.
        if (const std::uint64_t at = cut_in(msg_start, msg_end)) {
            skip_to_cut(at);
            return false;
        }
        std::uint64_t n = std::min<std::uint64_t>({head_ - tail_, body - done, chunk});
        if (done < payload_len)
            copy_out(tail_, out + done, std::min<std::uint64_t>(n, payload_len - done), payload_len);
        tail_ += n;
        done += n;
        if (done < body) publish_tail(tail_);
    }
    ++seq_;
    store_release_u64(word(kOffConsSeq), seq_);
    publish_tail(tail_);
    return true;
}

bool Ring::wait_space(std::uint64_t need, double deadline, const GilHooks& hooks) {
    if (cap_ - (head_ - tail_) >= need) return true;
    read_tail_checked();
    if (cap_ - (head_ - tail_) >= need) return true;
    return wait(kSpace, need, deadline, hooks, kSpinStart) == 0;
}

void Ring::put_padding(std::uint64_t at, std::uint64_t bytes) {
    MsgHeader h{};
    h.magic = kPadMagic;
    h.header_len = static_cast<std::uint32_t>(kAlign);
    h.payload_len = bytes - kAlign;
    h.seq = seq_;
    std::memcpy(data() + at % cap_, &h, sizeof h);
}

bool Ring::place_loan(std::size_t hdr_len, std::size_t payload_len, std::uint64_t total, double deadline,
                      const GilHooks& hooks) {
    // data() is page-aligned (the mapping is, and the segment header is one page), so a ring
    // position p holds address data() + p. Positions and hdr_len are multiples of 64, so every
    // gap below is too, and a gap of 64 or more holds a padding record.
    const bool page_align = payload_len >= kPageAlignedLoanMin && total + kPageBytes <= cap_;
    auto gap_to_page = [&](std::uint64_t pos) -> std::uint64_t {
        return page_align ? (kPageBytes - (pos + hdr_len) % kPageBytes) % kPageBytes : 0;
    };
    loan_wrap_pad_ = 0;
    loan_skip_ = false;
    std::uint64_t pos = head_ % cap_;
    // Would wrap, or wraps early to reuse memory: restart at position 0.
    if (pos + gap_to_page(pos) + total > cap_ || wrap_early(pos, gap_to_page(0) + total, page_align)) {
        const std::uint64_t to_end = cap_ - pos;
        // The padding goes out with the message, in one publication: a padding record
        // published on its own would wake the consumer for nothing, and its short wait would
        // teach the consumer's spin to give up before the message comes. A ring too small for
        // both at once empties first, and the loan skips to its start (skip_to_lap_start at
        // publish): a loan that times out meanwhile reserves nothing.
        loan_wrap_pad_ = to_end;
        if (to_end + gap_to_page(0) + total > cap_) {
            if (!wait_space(cap_, deadline, hooks)) return false;
            loan_skip_ = true;
        }
        pos = 0;
    }
    loan_gap_pad_ = gap_to_page(pos);  // after a wrap: gap + total <= cap_ (page_align)
    return wait_space((loan_skip_ ? 0 : loan_wrap_pad_) + loan_gap_pad_ + total, deadline, hooks);
}

// A large loan goes back to the start of the ring, although it would fit where the ring's
// head is, when the consumer waits for it and the start of the ring is free already. A
// producer whose consumer keeps up then writes the same one or two stretches of the ring again
// and again (as iceoryx2 reuses its samples) instead of walking through all of it, and a copy
// into memory written recently is faster. evidence: shm-early-wrap
//
// The padding to the ring's end counts as unread until the consumer passes it, so an early
// wrap takes that stretch from the producer's room until then. Only a waiting consumer lets it
// happen: it reads the message (and passes the padding) as soon as it is published. A consumer
// that lags (holding the start of the ring) or works between messages keeps the whole ring as
// room for the producer. Small messages stay packed: they are cheap to copy wherever they go.
bool Ring::wrap_early(std::uint64_t pos, std::uint64_t need_at_start, bool large) {
    if (!large || pos == 0) return false;
    if (load_acquire_u32(word(kOffConsAwaiting)) == 0)
        return false;
    const std::uint64_t free_now = cap_ - (head_ - read_tail_checked());
    return (cap_ - pos) + need_at_start <= free_now;
}

std::uint8_t* Ring::loan(const void* hdr, std::size_t hdr_len, std::size_t payload_len, double timeout_s,
                         const GilHooks& hooks, std::uint64_t& id) {
    BusyGuard busy(*this);
    claim(Role::Producer);
    check_header();
    check_abandoned();
    if (load_acquire_u32(word(kOffConsClosed)) != 0)
        throw ShmClosed("the consumer closed the channel; the message would never be read");
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (ledger_->loan_id != 0)
            throw ShmError("a loaned array is outstanding on this channel: publish() or discard() it first "
                           "(one loan at a time)");
    }
    if (hdr_len % kAlign != 0 || hdr_len == 0 || hdr_len > sizeof loan_hdr_ || hdr_len > cap_ / 4)
        throw ShmError("internal error: message header length " + std::to_string(hdr_len));
    const std::uint64_t total = hdr_len + pad64(payload_len);
    if (payload_len > cap_ || total > cap_)
        throw ShmError("a loan of " + std::to_string(payload_len) + " bytes does not fit in the ring (capacity " +
                       std::to_string(cap_) + " bytes)");
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity()
                                          : monotonic_seconds() + timeout_s;
    if (!place_loan(hdr_len, payload_len, total, deadline, hooks)) return nullptr;
    std::memcpy(loan_hdr_, hdr, hdr_len);
    loan_hdr_len_ = hdr_len;
    loan_total_ = total;
    std::uint8_t* slot = data() + (head_ + loan_wrap_pad_ + loan_gap_pad_) % cap_;
    std::memcpy(slot, hdr, hdr_len);
    std::lock_guard<std::mutex> lock(ledger_->mu);
    id = ledger_->next_id++;
    ledger_->loan_id = id;
    return slot + hdr_len;
}

void Ring::publish_loan(std::uint64_t id) {
    BusyGuard busy(*this);
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (id == 0 || ledger_->loan_id != id)
            throw ShmError("this array is not the channel's outstanding loan (it was published or discarded "
                           "already, or belongs to another channel)");
        ledger_->loan_id = 0;  // from here the loan is over, sent or not
    }
    claim(Role::Producer);
    check_header();
    check_abandoned();
    if (load_acquire_u32(word(kOffConsClosed)) != 0)
        throw ShmClosed("the consumer closed the channel; the loaned message was not sent");
    // The padding records and the header are written now: the slot is shared memory, and
    // nothing written there since loan() is trusted.
    if (loan_skip_) skip_to_lap_start();
    std::uint64_t at = head_;
    if (loan_wrap_pad_ && !loan_skip_) {
        put_padding(at, loan_wrap_pad_);
        at += loan_wrap_pad_;
    }
    if (loan_gap_pad_) put_padding(at, loan_gap_pad_);
    at += loan_gap_pad_;
    reinterpret_cast<MsgHeader*>(loan_hdr_)->seq = seq_;
    std::memcpy(data() + at % cap_, loan_hdr_, loan_hdr_len_);
    head_ = at + loan_total_;
    ++seq_;
    store_release_u64(word(kOffProdSeq), seq_);
    publish_head(head_);
}

const std::uint8_t* Ring::take_view(const MsgInfo& info, double timeout_s, const GilHooks& hooks,
                                    std::uint64_t& id, bool& timed_out) {
    BusyGuard busy(*this);
    claim(Role::Consumer);
    timed_out = false;
    if (!peeked_ || info.payload_len != peeked_payload_ || info.header_len != peeked_hdr_)
        throw ShmError("internal error: take_view() without a matching peek()");
    const std::uint64_t total = peeked_hdr_ + pad64(peeked_payload_);
    // peek() bounded header_len by 64 + 8*64 + 1024 and payload_len by 2^46, so no overflow.
    if (partial_.active || total > cap_ || tail_ % cap_ + total > cap_) return nullptr;  // not contiguous: copy it
    const double deadline = timeout_s < 0 ? std::numeric_limits<double>::infinity()
                                          : monotonic_seconds() + timeout_s;
    if (head_ - tail_ < total) {
        read_head_checked();
        if (head_ - tail_ < total && wait(kData, total, deadline, hooks, spin_mid_message_seconds()) != 0) {
            peeked_ = false;  // nothing consumed; the next call peeks again
            timed_out = true;
            return nullptr;
        }
    }
    peeked_ = false;
    const std::uint8_t* payload = data() + tail_ % cap_ + peeked_hdr_;
    {
        std::lock_guard<std::mutex> lock(ledger_->mu);
        id = ledger_->next_id++;
        ledger_->held.push_back(SlotLedger::Held{id, tail_, tail_ + total, false});
        tail_ += total;
        ledger_->read_pos = tail_;
        ledger_->settle_locked();  // the tail stays at the oldest view held
    }
    ++seq_;
    store_release_u64(word(kOffConsSeq), seq_);
    return payload;
}

std::uint64_t Ring::pending_bytes() {
    if (!base_) return 0;
    std::uint64_t h = load_acquire_u64(word(kOffHead));
    std::uint64_t t = load_acquire_u64(word(kOffTail));
    if (role_ == Role::Consumer) {
        // Bytes held by views are received already (held_bytes counts them).
        std::lock_guard<std::mutex> lock(ledger_->mu);
        if (ledger_->read_pos - t <= cap_) t = ledger_->read_pos;
    }
    t = after_skip(t, h);
    std::uint64_t d = h - t;
    return d > cap_ ? 0 : d;
}


}  // namespace shm
}  // namespace fastcopy
