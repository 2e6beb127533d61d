// The measurements behind thresholds and built-in bands (docs/evidence/<subject>.md, format in
// docs/evidence/README.md), compiled into the library by cmake/embed_evidence.cmake so that an
// installed module can print the entries its reasons cite. Reasons and comments cite entries
// with the word "evidence:" followed by their ids, separated by ", ".
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace fastcopy {
namespace evidence {

struct EmbeddedFile {
    const char* subject;  // the file name without ".md"
    const char* text;
    std::size_t size;
};
// Defined in the generated source; the last element is {nullptr, nullptr, 0}.
extern const EmbeddedFile kEmbeddedFiles[];
extern const std::size_t kEmbeddedFileCount;

struct Entry {
    std::string id, subject;
    std::string claim, figures, machine, date, command;  // continuation lines joined by '\n'
};

// The five fields of an entry, in the order the format requires them.
const std::vector<std::string>& field_names();  // "Claim", "Figures", "Machine", "Date", "Command"

// Every entry of every embedded file, in file then section order.
const std::vector<Entry>& entries();
// Problems of the embedded files' format (a missing, repeated or out-of-order field, a
// malformed or duplicate id, text outside a field); empty when they are well formed.
const std::vector<std::string>& problems();
// The format problems of one file's text on its own (for tests of the reader).
std::vector<std::string> check_text(const std::string& subject, const std::string& text);
// The entry with this id, or nullptr.
const Entry* find(const std::string& id);
// The ids cited in a text (each "evidence:" followed by ids separated by ", "), in order,
// without repeats.
std::vector<std::string> cited_ids(const std::string& text);
// True for a well-formed id: [a-z0-9]+(-[a-z0-9]+)*.
bool valid_id(const std::string& id);

}  // namespace evidence
}  // namespace fastcopy
