// Executing a profile (the definitions are inline in select.h, for copy_bytes()).
#include "select.h"

namespace fastcopy {
namespace policy {

AddressClass classify(const void* dst, const void* src, std::size_t n) { return classify_inline(dst, src, n); }

Choice choose(const Profile& p, const void* dst, const void* src, std::size_t n, Region region) {
    return choose_inline(p, dst, src, n, region);
}

}  // namespace policy
}  // namespace fastcopy
