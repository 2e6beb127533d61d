// Profiles as JSON (docs/profile-format.md): a small hand-written reader (no dependencies),
// validation against this CPU, and the writer. Hostile input must not crash, recurse without
// bound or select a kernel the CPU lacks: every problem is a std::invalid_argument naming the
// JSON path and what is wrong.
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "profile.h"

namespace fastcopy {
namespace policy {
namespace {

// ---- reader ----------------------------------------------------------------------------
struct Json {
    enum Type { Null, Bool, Number, String, Array, Object } type = Null;
    bool boolean = false;
    bool integer = false;            // digits only (optionally '-'), no fraction or exponent
    bool negative = false;
    unsigned long long uint = 0;     // magnitude, when integer and it fits
    bool too_large = false;          // integer with more than 19 digits
    std::string text;                // String value, or the number's spelling
    std::vector<Json> items;
    std::vector<std::pair<std::string, Json>> members;

    const Json* get(const std::string& key) const {
        for (const auto& m : members)
            if (m.first == key) return &m.second;
        return nullptr;
    }
};

class Reader {
public:
    explicit Reader(const std::string& s) : s_(s) {}
    Json document() {
        Json v = value(0);
        skip_ws();
        if (pos_ != s_.size()) fail("unexpected text after the JSON value");
        return v;
    }

private:
    const std::string& s_;
    std::size_t pos_ = 0;

    [[noreturn]] void fail(const std::string& what) const {
        std::size_t line = 1, col = 1;
        for (std::size_t i = 0; i < pos_ && i < s_.size(); ++i) {
            if (s_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        throw std::invalid_argument("bad JSON at line " + std::to_string(line) + ", column " + std::to_string(col) +
                                    ": " + what);
    }
    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
    }
    bool literal(const char* word) {
        std::size_t n = std::char_traits<char>::length(word);
        if (s_.compare(pos_, n, word) != 0) return false;
        pos_ += n;
        return true;
    }
    Json value(int depth) {
        if (depth > kMaxJsonDepth) fail("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        skip_ws();
        if (pos_ >= s_.size()) fail("unexpected end of text");
        Json v;
        char c = s_[pos_];
        if (c == '{') {
            v.type = Json::Object;
            ++pos_;
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == '}') {
                ++pos_;
                return v;
            }
            for (;;) {
                skip_ws();
                if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a quoted key");
                std::string key = string();
                if (v.get(key)) fail("duplicate key \"" + key + "\"");
                skip_ws();
                if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':' after a key");
                ++pos_;
                v.members.emplace_back(key, value(depth + 1));
                skip_ws();
                if (pos_ < s_.size() && s_[pos_] == ',') {
                    ++pos_;
                    continue;
                }
                if (pos_ < s_.size() && s_[pos_] == '}') {
                    ++pos_;
                    return v;
                }
                fail("expected ',' or '}' in an object");
            }
        }
        if (c == '[') {
            v.type = Json::Array;
            ++pos_;
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == ']') {
                ++pos_;
                return v;
            }
            for (;;) {
                v.items.push_back(value(depth + 1));
                skip_ws();
                if (pos_ < s_.size() && s_[pos_] == ',') {
                    ++pos_;
                    continue;
                }
                if (pos_ < s_.size() && s_[pos_] == ']') {
                    ++pos_;
                    return v;
                }
                fail("expected ',' or ']' in an array");
            }
        }
        if (c == '"') {
            v.type = Json::String;
            v.text = string();
            return v;
        }
        if (literal("true")) {
            v.type = Json::Bool;
            v.boolean = true;
            return v;
        }
        if (literal("false")) {
            v.type = Json::Bool;
            return v;
        }
        if (literal("null")) return v;
        if (c == '-' || (c >= '0' && c <= '9')) return number();
        fail(std::string("unexpected character '") + (c >= 32 && c < 127 ? std::string(1, c) : "?") + "'");
    }
    Json number() {
        Json v;
        v.type = Json::Number;
        std::size_t start = pos_;
        if (s_[pos_] == '-') {
            v.negative = true;
            ++pos_;
        }
        std::size_t digits = pos_;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        if (pos_ == digits) fail("a number needs digits");
        if (pos_ - digits > 1 && s_[digits] == '0') fail("numbers must not have leading zeros");
        v.integer = true;
        if (pos_ - digits > 19) {
            v.too_large = true;
        } else {
            for (std::size_t i = digits; i < pos_; ++i) v.uint = v.uint * 10 + static_cast<unsigned>(s_[i] - '0');
        }
        if (pos_ < s_.size() && s_[pos_] == '.') {
            v.integer = false;
            ++pos_;
            std::size_t f = pos_;
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
            if (pos_ == f) fail("a fraction needs digits");
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            v.integer = false;
            ++pos_;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
            std::size_t e = pos_;
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
            if (pos_ == e) fail("an exponent needs digits");
        }
        v.text = s_.substr(start, pos_ - start);
        return v;
    }
    static void utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }
    unsigned hex4() {
        if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            char c = s_[pos_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
            else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
            else fail("bad hex digit in a \\u escape");
        }
        return v;
    }
    std::string string() {
        ++pos_;  // opening quote
        std::string out;
        for (;;) {
            if (pos_ >= s_.size()) fail("unterminated string");
            unsigned char c = static_cast<unsigned char>(s_[pos_++]);
            if (c == '"') return out;
            if (c < 0x20) fail("control character inside a string");
            if (c != '\\') {
                out += static_cast<char>(c);
                continue;
            }
            if (pos_ >= s_.size()) fail("unterminated escape");
            char e = s_[pos_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned cp = hex4();
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') fail("lone surrogate");
                        pos_ += 2;
                        unsigned lo = hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("bad surrogate pair");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail("lone surrogate");
                    }
                    utf8(out, cp);
                    break;
                }
                default: fail(std::string("bad escape \\") + e);
            }
        }
    }
};

// ---- writer ----------------------------------------------------------------------------
std::string quote(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out + "\"";
}

std::string compact(const Json& v) {
    switch (v.type) {
        case Json::Null: return "null";
        case Json::Bool: return v.boolean ? "true" : "false";
        case Json::Number: return v.text;
        case Json::String: return quote(v.text);
        case Json::Array: {
            std::string s = "[";
            for (std::size_t i = 0; i < v.items.size(); ++i) s += (i ? "," : "") + compact(v.items[i]);
            return s + "]";
        }
        case Json::Object: {
            std::string s = "{";
            for (std::size_t i = 0; i < v.members.size(); ++i)
                s += (i ? "," : "") + quote(v.members[i].first) + ":" + compact(v.members[i].second);
            return s + "}";
        }
    }
    return "null";
}

std::string size_json(std::size_t n) { return n == SIZE_MAX ? "null" : std::to_string(n); }

// ---- validation --------------------------------------------------------------------------
[[noreturn]] void bad(const std::string& path, const std::string& what) {
    throw std::invalid_argument(path + ": " + what);
}

const char* type_words(const Json& v) {
    switch (v.type) {
        case Json::Null: return "null";
        case Json::Bool: return "a boolean";
        case Json::Number: return "a number";
        case Json::String: return "a string";
        case Json::Array: return "a list";
        case Json::Object: return "an object";
    }
    return "?";
}

const Json& need(const Json& obj, const std::string& key, const std::string& path) {
    const Json* v = obj.get(key);
    if (!v) bad(path, "missing key \"" + key + "\"");
    return *v;
}

void need_type(const Json& v, Json::Type t, const char* words, const std::string& path) {
    if (v.type != t) bad(path, std::string("must be ") + words + ", not " + type_words(v));
}

std::string text_field(const Json& v, const std::string& path, std::size_t max_chars = kMaxWhyChars) {
    need_type(v, Json::String, "a string", path);
    if (v.text.size() > max_chars) bad(path, "longer than " + std::to_string(max_chars) + " characters");
    return v.text;
}

std::string optional_text(const Json& obj, const char* key, const std::string& path) {
    const Json* v = obj.get(key);
    if (!v || v->type == Json::Null) return "";
    return text_field(*v, path + "." + key);
}

// A whole number of bytes in [lo, hi]; null gives SIZE_MAX when allowed.
// A whole number in [lo, hi]: a size in bytes (limits said as sizes), or with `unit` empty
// a count (limits said as numbers).
std::size_t whole_field(const Json& v, const std::string& path, std::size_t lo, std::size_t hi, bool null_ok,
                        const char* unit) {
    const bool bytes = unit[0] != '\0';
    const std::string what = bytes ? std::string("a whole number of ") + unit : "a whole number";
    auto limit = [&](std::size_t x) { return bytes ? size_words(x) : std::to_string(x); };
    if (v.type == Json::Null) {
        if (null_ok) return SIZE_MAX;
        bad(path, "must be " + what + ", not null");
    }
    need_type(v, Json::Number, what.c_str(), path);
    if (!v.integer) bad(path, v.text + " is not a whole number");
    if (v.negative && v.uint != 0) bad(path, v.text + " is negative");
    if (v.too_large || v.uint > hi) bad(path, v.text + " is absurd: more than " + limit(hi));
    if (v.uint < lo) bad(path, v.text + " is below the minimum of " + limit(lo));
    return static_cast<std::size_t>(v.uint);
}

std::size_t size_field(const Json& v, const std::string& path, std::size_t lo, std::size_t hi, bool null_ok) {
    return whole_field(v, path, lo, hi, null_ok, "bytes");
}

void check_keys(const Json& obj, const std::vector<const char*>& allowed, const std::string& path) {
    for (const auto& m : obj.members) {
        bool ok = false;
        for (const char* a : allowed) ok = ok || m.first == a;
        if (!ok) {
            std::string list;
            for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
            bad(path, "unknown key \"" + m.first + "\" (expected: " + list + ")");
        }
    }
}

KernelFacts kernel_field(const Json& v, const std::string& path, const CpuFacts& cpu, bool streaming) {
    std::string name = text_field(v, path, 64);
    // Unknown names are rejected before interning, so a hostile file cannot grow the name table.
    bool known = kernel_in_build(name);
    if (!known) bad(path, "unknown kernel '" + name + "'; kernels of this build usable here: " + usable_kernel_names(cpu));
    KernelFacts k = kernel_facts(name, cpu);
    if (!k.usable) bad(path, "kernel '" + name + "' is not usable on this CPU (" + k.why_not + ")");
    if (streaming && !k.streaming) bad(path, "kernel '" + name + "' does not stream (non-temporal stores); nt needs one that does");
    if (!streaming && k.streaming)
        bad(path, "kernel '" + name + "' uses non-temporal stores; it belongs in \"nt\", not in a band");
    return k;
}

std::vector<Band> bands_field(const Json& v, const std::string& path, const CpuFacts& cpu) {
    need_type(v, Json::Array, "a list of bands", path);
    if (v.items.empty()) bad(path, "needs at least one band (the first from 0)");
    if (v.items.size() > kMaxBands) bad(path, std::to_string(v.items.size()) + " bands: at most " + std::to_string(kMaxBands));
    std::vector<Band> out;
    for (std::size_t i = 0; i < v.items.size(); ++i) {
        std::string bp = path + "[" + std::to_string(i) + "]";
        const Json& b = v.items[i];
        need_type(b, Json::Object, "an object {from, kernel, why}", bp);
        Band band;
        band.from = size_field(need(b, "from", bp), bp + ".from", 0, kMaxSizeValue, false);
        if (i == 0 && band.from != 0) bad(bp + ".from", "the first band must start at 0, not " + std::to_string(band.from));
        if (i > 0 && band.from <= out.back().from)
            bad(bp + ".from", std::to_string(band.from) + " does not follow " + std::to_string(out.back().from) +
                                  ": bands must be sorted by \"from\", without overlap");
        KernelFacts k = kernel_field(need(b, "kernel", bp), bp + ".kernel", cpu, false);
        band.fn = k.fn;
        band.kernel = k.name;
        band.why = optional_text(b, "why", bp);
        out.push_back(std::move(band));
    }
    return out;
}

}  // namespace

Profile parse_profile(const std::string& json_text, const std::string& source, const CpuFacts& cpu) {
    if (json_text.size() > kMaxFileBytes)
        throw std::invalid_argument("profile is " + std::to_string(json_text.size()) + " bytes: more than the 1 MiB limit");
    Json doc = Reader(json_text).document();
    const std::string top = "profile";
    need_type(doc, Json::Object, "a JSON object", top);
    const Json& format = need(doc, "format", top);
    if (format.type != Json::String || format.text != kProfileFormat)
        bad("format", "must be \"fastcopy-profile\" (this is not a fastcopy profile)");
    const Json& version = need(doc, "version", top);
    if (version.type != Json::Number || !version.integer || version.negative || version.uint != kProfileVersion)
        bad("version", (version.type == Json::Number ? version.text : std::string(type_words(version))) +
                           " is not supported: this fastcopy reads version 1");
    Profile p;
    p.source = source;
    p.name = doc.get("name") ? text_field(*doc.get("name"), "name", kMaxNameChars) : "unnamed";
    if (const Json* prov = doc.get("provenance")) {
        if (prov->type != Json::Null) {
            need_type(*prov, Json::Object, "an object", "provenance");
            p.provenance.machine = optional_text(*prov, "machine", "provenance");
            p.provenance.date = optional_text(*prov, "date", "provenance");
            p.provenance.libc = optional_text(*prov, "libc", "provenance");
            p.provenance.method = optional_text(*prov, "method", "provenance");
        }
    }
    if (const Json* sig = doc.get("signature")) {
        if (sig->type != Json::Null) {
            need_type(*sig, Json::Object, "an object", "signature");
            p.signature_json = compact(*sig);
        }
    }
    const Json& regions = need(doc, "regions", top);
    need_type(regions, Json::Object, "an object with private, to_shared and from_shared", "regions");
    check_keys(regions, {"private", "to_shared", "from_shared"}, "regions");
    for (int r = 0; r < kRegions; ++r) {
        std::string rp = std::string("regions.") + region_key(r);
        const Json& region = need(regions, region_key(r), "regions");
        need_type(region, Json::Object, "an object", rp);
        check_keys(region, {"page_aligned", "near", "far", "backward", "nt", "rep_movsb_on"}, rp);
        RegionRules& rules = p.region[r];
        for (int c = 0; c < kClasses; ++c)
            rules.cls[c] = bands_field(need(region, class_key(c), rp), rp + "." + class_key(c), cpu);
        const Json& nt = need(region, "nt", rp);
        need_type(nt, Json::Object, "an object {threshold, kernel, why}", rp + ".nt");
        rules.nt.threshold = size_field(need(nt, "threshold", rp + ".nt"), rp + ".nt.threshold", kMinNtThreshold,
                                        kMaxSizeValue, true);
        rules.nt.why = optional_text(nt, "why", rp + ".nt");
        if (const Json* md = nt.get("min_page_distance")) {
            rules.nt.min_page_distance = size_field(*md, rp + ".nt.min_page_distance", 0, kMaxPageDistance, false);
            if (const Json* below = nt.get("min_page_distance_below"))
                rules.nt.min_page_distance_below =
                    size_field(*below, rp + ".nt.min_page_distance_below", 0, kMaxSizeValue, true);
        } else if (nt.get("min_page_distance_below")) {
            bad(rp + ".nt.min_page_distance_below", "needs min_page_distance, the guard it limits");
        } else if (rules.nt.threshold != SIZE_MAX) {
            // Not stated: keep the built-in profile's guard for this CPU. Streaming stores at small
            // page distances can run several times slower than plain ones (evidence:
            // zen3-nt-page-distance); a profile that did not measure those distances keeps the guard.
            const NtRule& builtin_nt = builtin_profile(cpu).region[r].nt;
            rules.nt.min_page_distance = builtin_nt.min_page_distance;
            rules.nt.min_page_distance_below = builtin_nt.min_page_distance_below;
            if (rules.nt.min_page_distance)
                rules.nt.why += (rules.nt.why.empty() ? "" : "; ") + std::string("only at (dst - src) mod 4096 = 0 or >= ") +
                                std::to_string(rules.nt.min_page_distance) +
                                (rules.nt.min_page_distance_below == SIZE_MAX
                                     ? std::string()
                                     : " below " + std::to_string(rules.nt.min_page_distance_below) + " bytes") +
                                " (the built-in profile's guard)";
        }
        const Json* ntk = nt.get("kernel");
        if (rules.nt.threshold != SIZE_MAX) {
            if (!ntk || ntk->type == Json::Null) bad(rp + ".nt.kernel", "a threshold needs a streaming kernel");
            KernelFacts k = kernel_field(*ntk, rp + ".nt.kernel", cpu, true);
            rules.nt.fn = k.fn;
            rules.nt.kernel = k.name;
        } else if (ntk && ntk->type != Json::Null) {
            kernel_field(*ntk, rp + ".nt.kernel", cpu, true);  // still must be valid, though unused
        }
        if (const Json* lf = nt.get("learn_from")) {
            rules.nt.learn_from = size_field(*lf, rp + ".nt.learn_from", kMinNtLearnFrom, kMaxSizeValue, true);
            if (rules.nt.learn_from != SIZE_MAX && r != static_cast<int>(Region::Private))
                bad(rp + ".nt.learn_from", "private region only (copies into shared memory learn per loan; write null)");
            if (rules.nt.learn_from != SIZE_MAX && rules.nt.threshold == SIZE_MAX)
                bad(rp + ".nt.learn_from", "needs a threshold and a kernel: it chooses between cached stores and "
                                           "the NT kernel");
        } else if (r == static_cast<int>(Region::Private)) {
            // Not stated: the built-in profile's value for this CPU, where this profile has an NT
            // rule. tune times hot copies only and cannot judge it.
            const std::size_t builtin_from = builtin_profile(cpu).region[r].nt.learn_from;
            if (builtin_from != SIZE_MAX && rules.nt.threshold != SIZE_MAX) {
                rules.nt.learn_from = builtin_from;
                rules.nt.why += (rules.nt.why.empty() ? "" : "; ") + std::string("from ") +
                                std::to_string(builtin_from) +
                                " bytes the store mode is learned (the built-in profile's nt.learn_from)";
            }
        }
        if (const Json* on = region.get("rep_movsb_on")) {
            rules.erms_on_request = size_field(*on, rp + ".rep_movsb_on", 0, kMaxSizeValue, true);
            rules.erms_on_request_why = "FASTCOPY_REP_MOVSB=on: rep movsb in the far class (from the profile)";
        } else {
            rules.erms_on_request = kGlibcRepMovsbFrom;
            rules.erms_on_request_why = "FASTCOPY_REP_MOVSB=on: rep movsb in the far class from " +
                                        std::to_string(kGlibcRepMovsbFrom) + " B (glibc's threshold)";
        }
    }
    const Json& par = need(doc, "parallel", top);
    need_type(par, Json::Object, "an object {threshold, threads, why}", "parallel");
    p.parallel.threshold =
        size_field(need(par, "threshold", "parallel"), "parallel.threshold", kMinParallelThreshold, kMaxSizeValue, true);
    if (const Json* t = par.get("threads")) {
        std::size_t n = whole_field(*t, "parallel.threads", 0, kMaxThreads, false, "");
        p.parallel.threads = static_cast<unsigned>(n);
    }
    p.parallel.why = optional_text(par, "why", "parallel");
    // Not stated: the built-in profile's value for this CPU. tune times split copies on one
    // arena while the host keeps the CPUs where they are, and cannot judge it.
    if (const Json* lf = par.get("learn_from"))
        p.parallel.learn_from = size_field(*lf, "parallel.learn_from", kMinSplitLearnFrom, kMaxSizeValue, true);
    else
        p.parallel.learn_from = builtin_profile(cpu).parallel.learn_from;
    // Not stated: the built-in profile's value for this CPU. tune times private copies only.
    if (const Json* sf = par.get("shared_from"))
        p.parallel.shared_from =
            size_field(*sf, "parallel.shared_from", kMinParallelThreshold, kMaxSizeValue, true);
    else
        p.parallel.shared_from = builtin_profile(cpu).parallel.shared_from;
    if (const Json* notes = doc.get("notes")) {
        if (notes->type != Json::Null) {
            need_type(*notes, Json::Array, "a list of strings", "notes");
            if (notes->items.size() > kMaxNotes) bad("notes", "more than " + std::to_string(kMaxNotes) + " notes");
            for (std::size_t i = 0; i < notes->items.size(); ++i)
                p.notes.push_back(text_field(notes->items[i], "notes[" + std::to_string(i) + "]"));
        }
    }
    finalize(p);
    return p;
}

std::string signature_of(const std::string& json_text) {
    if (json_text.size() > kMaxFileBytes)
        throw std::invalid_argument("profile is " + std::to_string(json_text.size()) + " bytes: more than the 1 MiB limit");
    Json doc = Reader(json_text).document();
    if (doc.type != Json::Object) throw std::invalid_argument("profile: must be a JSON object");
    const Json* sig = doc.get("signature");
    return sig && sig->type == Json::Object ? compact(*sig) : "";
}

std::vector<std::pair<std::string, std::string>> signature_fields(const std::string& json_text) {
    if (json_text.size() > kMaxFileBytes)
        throw std::invalid_argument("profile is " + std::to_string(json_text.size()) + " bytes: more than the 1 MiB limit");
    Json doc = Reader(json_text).document();
    if (doc.type != Json::Object) throw std::invalid_argument("profile: must be a JSON object");
    std::vector<std::pair<std::string, std::string>> out;
    const Json* sig = doc.get("signature");
    if (sig && sig->type == Json::Object)
        for (const auto& m : sig->members) out.emplace_back(m.first, compact(m.second));
    return out;
}

std::string compact_json(const std::string& json_text) {
    if (json_text.size() > kMaxFileBytes)
        throw std::invalid_argument("JSON text is " + std::to_string(json_text.size()) + " bytes: more than the 1 MiB limit");
    return compact(Reader(json_text).document());
}

std::string to_json(const Profile& p) {
    std::string o = "{\n  \"format\": \"fastcopy-profile\",\n  \"version\": 1,\n  \"name\": " + quote(p.name) + ",\n";
    o += "  \"provenance\": {\"machine\": " + quote(p.provenance.machine) + ", \"date\": " + quote(p.provenance.date) +
         ", \"libc\": " + quote(p.provenance.libc) + ", \"method\": " + quote(p.provenance.method) + "},\n";
    if (!p.signature_json.empty()) o += "  \"signature\": " + p.signature_json + ",\n";
    o += "  \"regions\": {\n";
    for (int r = 0; r < kRegions; ++r) {
        const RegionRules& rules = p.region[r];
        o += std::string("    ") + quote(region_key(r)) + ": {\n";
        for (int c = 0; c < kClasses; ++c) {
            o += std::string("      ") + quote(class_key(c)) + ": [";
            const auto& bands = rules.cls[c];
            for (std::size_t i = 0; i < bands.size(); ++i)
                o += std::string(i ? ",\n        " : "\n        ") + "{\"from\": " + std::to_string(bands[i].from) +
                     ", \"kernel\": " + quote(bands[i].kernel) + ", \"why\": " + quote(bands[i].why) + "}";
            o += "],\n";
        }
        o += "      \"nt\": {\"threshold\": " + size_json(rules.nt.threshold) + ", \"kernel\": " +
             (rules.nt.kernel && rules.nt.threshold != SIZE_MAX ? quote(rules.nt.kernel) : std::string("null")) +
             ", \"min_page_distance\": " + std::to_string(rules.nt.min_page_distance) +
             ", \"min_page_distance_below\": " + size_json(rules.nt.min_page_distance_below) +
             ", \"learn_from\": " + size_json(rules.nt.learn_from) + ", \"why\": " +
             quote(rules.nt.why) + "},\n";
        o += "      \"rep_movsb_on\": " + size_json(rules.erms_on_request) + "\n";
        o += std::string("    }") + (r + 1 < kRegions ? ",\n" : "\n");
    }
    o += "  },\n  \"parallel\": {\"threshold\": " + size_json(p.parallel.threshold) +
         ", \"threads\": " + std::to_string(p.parallel.threads) + ", \"learn_from\": " + size_json(p.parallel.learn_from) +
         ", \"shared_from\": " + size_json(pool_threshold(p, Region::ToShared)) + ", \"why\": " + quote(p.parallel.why) + "}";
    if (!p.notes.empty()) {
        o += ",\n  \"notes\": [";
        for (std::size_t i = 0; i < p.notes.size(); ++i) o += (i ? ", " : "") + quote(p.notes[i]);
        o += "]";
    }
    return o + "\n}\n";
}

}  // namespace policy
}  // namespace fastcopy
