// Reads the embedded evidence files (format: docs/evidence/README.md).
#include "evidence.h"

#include <set>

namespace fastcopy {
namespace evidence {
namespace {

bool id_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

struct Parsed {
    std::vector<Entry> entries;
    std::vector<std::string> problems;
};

std::string* field_of(Entry& e, std::size_t i) {
    std::string* fields[] = {&e.claim, &e.figures, &e.machine, &e.date, &e.command};
    return fields[i];
}

void parse_file(const std::string& subject, const std::string& text, std::set<std::string>& seen, Parsed& out) {
    const std::vector<std::string>& names = field_names();
    Entry* entry = nullptr;
    std::size_t next_field = 0;   // index of the field expected next
    std::string* open = nullptr;  // the field that continuation lines extend
    int line_no = 0;
    auto where = [&] { return subject + ".md:" + std::to_string(line_no); };
    auto close_entry = [&] {
        if (!entry) return;
        for (std::size_t i = 0; i < names.size(); ++i)
            if (field_of(*entry, i)->empty())
                out.problems.push_back(subject + ".md: " + entry->id + ": no " + names[i] + " (or an empty one)");
    };
    std::size_t pos = 0;
    while (pos <= text.size()) {
        std::size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::string line = text.substr(pos, eol - pos);
        pos = eol + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.compare(0, 3, "## ") == 0) {
            close_entry();
            out.entries.push_back(Entry{});
            entry = &out.entries.back();
            entry->id = line.substr(3);
            entry->subject = subject;
            next_field = 0;
            open = nullptr;
            if (!valid_id(entry->id)) out.problems.push_back(where() + ": id '" + entry->id + "' is not kebab-case");
            if (!seen.insert(entry->id).second) out.problems.push_back(where() + ": id '" + entry->id + "' repeated");
            continue;
        }
        if (!entry) continue;  // the title and the introduction
        if (line.find_first_not_of(' ') == std::string::npos) {
            open = nullptr;
            continue;
        }
        if (line.compare(0, 2, "- ") == 0) {
            std::size_t colon = line.find(':');
            std::string name = colon == std::string::npos ? "" : line.substr(2, colon - 2);
            std::size_t i = 0;
            while (i < names.size() && names[i] != name) ++i;
            if (i == names.size()) {
                out.problems.push_back(where() + ": " + entry->id + ": '" + line.substr(0, 40) +
                                       "' is not one of the fields Claim, Figures, Machine, Date, Command");
                open = nullptr;
                continue;
            }
            if (i != next_field)
                out.problems.push_back(where() + ": " + entry->id + ": " + name + " out of order or repeated (expected " +
                                       (next_field < names.size() ? names[next_field] : std::string("no more fields")) +
                                       ")");
            next_field = i + 1;
            std::string value = line.substr(colon + 1);
            std::size_t b = value.find_first_not_of(' ');
            open = field_of(*entry, i);
            *open = b == std::string::npos ? "" : value.substr(b);
            continue;
        }
        if (open && line.compare(0, 2, "  ") == 0) {
            *open += (open->empty() ? "" : "\n") + line.substr(2);
            continue;
        }
        out.problems.push_back(where() + ": " + entry->id + ": text outside a field: '" + line.substr(0, 40) + "'");
    }
    close_entry();
}

const Parsed& parsed() {
    static const Parsed all = [] {
        Parsed p;
        std::set<std::string> seen;
        for (std::size_t i = 0; i < kEmbeddedFileCount; ++i)
            parse_file(kEmbeddedFiles[i].subject, std::string(kEmbeddedFiles[i].text, kEmbeddedFiles[i].size), seen, p);
        return p;
    }();
    return all;
}

}  // namespace

const std::vector<std::string>& field_names() {
    static const std::vector<std::string> names = {"Claim", "Figures", "Machine", "Date", "Command"};
    return names;
}

const std::vector<Entry>& entries() { return parsed().entries; }

std::vector<std::string> check_text(const std::string& subject, const std::string& text) {
    Parsed p;
    std::set<std::string> seen;
    parse_file(subject, text, seen, p);
    return p.problems;
}
const std::vector<std::string>& problems() { return parsed().problems; }

const Entry* find(const std::string& id) {
    for (const Entry& e : entries())
        if (e.id == id) return &e;
    return nullptr;
}

bool valid_id(const std::string& id) {
    if (id.empty() || id.front() == '-' || id.back() == '-' || id.find("--") != std::string::npos) return false;
    for (char c : id)
        if (!id_char(c)) return false;
    return true;
}

std::vector<std::string> cited_ids(const std::string& text) {
    static const std::string kWord = "evidence:";
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (std::size_t at = text.find(kWord); at != std::string::npos; at = text.find(kWord, at + 1)) {
        std::size_t i = at + kWord.size();
        for (;;) {
            while (i < text.size() && text[i] == ' ') ++i;
            std::size_t b = i;
            while (i < text.size() && id_char(text[i])) ++i;
            std::string id = text.substr(b, i - b);
            while (!id.empty() && id.back() == '-') id.pop_back();
            if (id.empty()) break;
            if (seen.insert(id).second) out.push_back(id);
            if (i + 1 < text.size() && text[i] == ',' && text[i + 1] == ' ') {
                ++i;
                continue;
            }
            break;
        }
    }
    return out;
}

}  // namespace evidence
}  // namespace fastcopy
