// CHECK(cond) for the single-threaded C++ tests: a failed condition is printed with its file and
// line and counted; the test goes on. checks_passed(name) ends main: prints the outcome and gives
// the exit status.
#pragma once
#include <cstdio>

inline int g_failures = 0;

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            ++g_failures;                                                     \
        }                                                                     \
    } while (0)

inline int checks_passed(const char* name) {
    if (g_failures) {
        std::fprintf(stderr, "%s: %d check(s) failed\n", name, g_failures);
        return 1;
    }
    std::printf("%s: all passed\n", name);
    return 0;
}
