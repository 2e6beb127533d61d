// The layout of channel and topic segments as the shared-memory headers define it, for the
// Python code that reads segments without attaching (fastcopy.shm's list_segments) and for the
// tests that patch headers: _core.shm_layout(). Read-only data from shm_sync.h / shm_topic.h;
// nothing here decides an offset.
#include <cstddef>
#include <cstdint>

#include <pybind11/pybind11.h>

#include "python/layout_fields.h"
#include "shm/channel.h"
#include "shm/topic.h"

namespace py = pybind11;

namespace fastcopy {
namespace {

using shm::MsgHeader;

// Sizes of the header words: the type each is read and written as in shm_sync.cpp / shm_topic.cpp.
constexpr std::size_t kU32 = sizeof(std::uint32_t), kU64 = sizeof(std::uint64_t);

constexpr LayoutField kChannelFields[] = {
    {"magic", shm::kOffMagic, kU64},
    {"version", shm::kOffVersion, kU32},
    {"header_bytes", shm::kOffHeaderBytes, kU32},
    {"capacity", shm::kOffCapacity, kU64},
    {"producer_pid", shm::kOffProdPid, kU32},
    {"producer_closed", shm::kOffProdClosed, kU32},
    {"producer_start", shm::kOffProdStart, kU64},
    {"producer_seq", shm::kOffProdSeq, kU64},
    {"consumer_pid", shm::kOffConsPid, kU32},
    {"consumer_closed", shm::kOffConsClosed, kU32},
    {"consumer_start", shm::kOffConsStart, kU64},
    {"consumer_seq", shm::kOffConsSeq, kU64},
    {"head", shm::kOffHead, kU64},
    {"tail", shm::kOffTail, kU64},
    {"data_futex", shm::kOffDataFutex, kU32},
    {"consumer_waiting", shm::kOffConsWaiting, kU32},
    {"space_futex", shm::kOffSpaceFutex, kU32},
    {"producer_waiting", shm::kOffProdWaiting, kU32},
    {"abandoned", shm::kOffAbandoned, kU32},
    {"cut_at", shm::kOffCutAt, kU64},
    {"cut_ack", shm::kOffCutAck, kU64},
    {"creator_pid", shm::kOffCreatorPid, kU32},
    {"creator_start", shm::kOffCreatorStart, kU64},
    {"consumer_awaiting", shm::kOffConsAwaiting, kU32},
};

constexpr LayoutField kMessageFields[] = {
    {"magic", offsetof(MsgHeader, magic), sizeof(MsgHeader::magic)},
    {"header_len", offsetof(MsgHeader, header_len), sizeof(MsgHeader::header_len)},
    {"payload_len", offsetof(MsgHeader, payload_len), sizeof(MsgHeader::payload_len)},
    {"dtype_len", offsetof(MsgHeader, dtype_len), sizeof(MsgHeader::dtype_len)},
    {"ndim", offsetof(MsgHeader, ndim), sizeof(MsgHeader::ndim)},
    {"seq", offsetof(MsgHeader, seq), sizeof(MsgHeader::seq)},
};

constexpr LayoutField kTopicFields[] = {
    {"magic", shm::kTOffMagic, kU64},
    {"version", shm::kTOffVersion, kU32},
    {"header_bytes", shm::kTOffHeaderBytes, kU32},
    {"slots", shm::kTOffSlots, kU32},
    {"max_subscribers", shm::kTOffMaxSubs, kU32},
    {"slot_bytes", shm::kTOffSlotBytes, kU64},
    {"history", shm::kTOffHistory, kU32},
    {"overflow", shm::kTOffOverflow, kU32},
    {"total_bytes", shm::kTOffTotalBytes, kU64},
    {"publisher_pid", shm::kTOffPubPid, kU32},
    {"publisher_closed", shm::kTOffPubClosed, kU32},
    {"publisher_start", shm::kTOffPubStart, kU64},
    {"head", shm::kTOffHead, kU64},
    {"data_futex", shm::kTOffDataFutex, kU32},
    {"subscriber_waiting", shm::kTOffSubWaiting, kU32},
    {"space_futex", shm::kTOffSpaceFutex, kU32},
    {"publisher_waiting", shm::kTOffPubWaiting, kU32},
    {"creator_pid", shm::kTOffCreatorPid, kU32},
    {"creator_start", shm::kTOffCreatorStart, kU64},
};

constexpr LayoutField kRecordFields[] = {
    {"state", shm::kSubState, kU32},
    {"pid", shm::kSubPid, kU32},
    {"start", shm::kSubStart, kU64},
    {"cursor", shm::kSubCursor, kU64},
    {"floor", shm::kSubFloor, kU64},
};

py::dict shm_layout() {
    py::dict channel;
    channel["magic"] = shm::kMagic;
    channel["version"] = shm::kVersion;
    channel["header_bytes"] = shm::kHeaderBytes;
    channel["fields"] = layout_fields(kChannelFields);

    py::dict message;
    message["magic"] = shm::kMsgMagic;
    message["pad_magic"] = shm::kPadMagic;
    message["bytes"] = sizeof(MsgHeader);
    message["align"] = shm::kAlign;
    message["fields"] = layout_fields(kMessageFields);

    py::dict states;
    states["free"] = static_cast<std::uint32_t>(shm::kSubFree);
    states["active"] = static_cast<std::uint32_t>(shm::kSubActive);
    states["pins_only"] = static_cast<std::uint32_t>(shm::kSubPinsOnly);

    py::dict topic;
    topic["magic"] = shm::kTopicMagic;
    topic["version"] = shm::kTopicVersion;
    topic["header_bytes"] = shm::kHeaderBytes;
    topic["record_bytes"] = shm::kTopicSubBytes;
    topic["max_subscribers"] = shm::kTopicMaxSubscribers;
    topic["slot_header_bytes"] = shm::kSlotHdrBytes;
    topic["slot_message_offset"] = shm::kSlotMsgHdrOff;
    topic["fields"] = layout_fields(kTopicFields);
    topic["record_fields"] = layout_fields(kRecordFields);
    topic["record_states"] = states;

    py::dict out;
    out["page_bytes"] = shm::kPageBytes;
    out["page_aligned_loan_min"] = shm::kPageAlignedLoanMin;
    out["creating_prefix"] = shm::kCreatingPrefix;
    out["channel"] = channel;
    out["message"] = message;
    out["topic"] = topic;
    return out;
}

}  // namespace
}  // namespace fastcopy

// Global: bindings.cpp declares it where it calls it, in PYBIND11_MODULE.
void bind_shm_layout(py::module_& m) {
    m.def("shm_layout", &fastcopy::shm_layout,
          "The layout of shared-memory segments from the C++ headers: for 'channel', 'topic' and "
          "'message' (a message header), the magic number, version and sizes, and 'fields': "
          "name -> (byte offset, size in bytes) of each header word (a topic also has "
          "'record_fields' of a subscriber record, 'record_bytes' apart after 'header_bytes'). "
          "Words are in the machine's byte order. 'creating_prefix': the name a segment has while "
          "it is made ('<prefix><pid>-<n>'), before it is linked to its own.");
}
