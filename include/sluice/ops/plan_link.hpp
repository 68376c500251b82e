#pragma once
// What plan tells the stages after it when the pipeline starts: its seed and its number
// of epochs. The shuffle takes plan's seed when it has none of its own ("one seed, given
// once"), and shuffle and batch refuse, at start, items that cannot keep several epochs
// apart (see epoch_policy).
//
// Setups run last stage first (core/pipeline.hpp), so a shuffle's or a batch's setup runs
// before plan's: they leave a listener in the run's state (run_state::slot), and plan's
// setup calls them with its facts, before it decides what to read again on resume. A
// listener that throws fails the start. Listeners nobody answers (a pipeline without
// plan) go with the run's state.

#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/core/state.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#endif

namespace sluice {

/// What shuffle and batch do with items that do not say which epoch they belong to (a
/// user's type without a `std::shared_ptr<const sluice::shard> source` member).
enum class epoch_policy {
    /// Keep epochs apart: items must carry their `source` shard when plan runs more than
    /// one epoch, else the pipeline refuses to start, naming the stage and the item type.
    apart,
    /// One stream: a shuffle buffer and a batch may span an epoch's end (epochs mix), and
    /// pipeline::state() refuses (positions within an epoch mean nothing then).
    ignore,
};

namespace detail {

/// What plan knows at start.
struct plan_facts {
    std::optional<std::uint64_t> seed;
    unsigned epochs = 1;
};

using plan_listener = std::function<void(const plan_facts&, run_state&)>;

/// This run's listeners, in the run's state (run_state::slot).
struct plan_board {
    std::mutex m;
    std::vector<plan_listener> waiting;
};

/// From a stage's setup (a stage after plan): `f` runs in plan's setup.
inline void listen_for_plan(stage_setup& s, plan_listener f) {
    auto b = s.internal.run->slot<plan_board>("plan");
    std::lock_guard lock(b->m);
    b->waiting.push_back(std::move(f));
}

/// From plan's setup: calls this run's listeners (last stage first) and forgets them.
inline void tell_plan(stage_setup& s, const plan_facts& f) {
    std::vector<plan_listener> ls;
    {
        auto b = s.internal.run->slot<plan_board>("plan");
        std::lock_guard lock(b->m);
        ls.swap(b->waiting);
    }
    for (auto& l : ls) l(f, *s.internal.run);
}

/// The type's name as the compiler writes it ("example", "std::vector<int>").
template <class T>
std::string type_name() {
    const char* raw = typeid(T).name();
#if __has_include(<cxxabi.h>)
    int status = 0;
    char* d = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
    if (d && status == 0) {
        std::string out(d);
        std::free(d);
        return out;
    }
    std::free(d);
#endif
    return raw;
}

/// For shuffle and batch: with items of type T that do not know their epoch and the
/// default policy, a plan of several epochs fails the start.
template <class T>
void check_epochs_at_start(stage_setup& s, const std::string& stage, epoch_policy p) {
    if constexpr (!has_epoch<T>) {
        if (p != epoch_policy::apart) return;
        listen_for_plan(s, [stage](const plan_facts& f, run_state&) {
            if (f.epochs <= 1) return;
            throw error("sluice: " + stage + ": plan runs " + std::to_string(f.epochs) + " epochs, but the items "
                        "reaching " + stage + " (" + type_name<T>() + ") do not say which epoch they belong to, so "
                        "epochs would mix in it. Give the type a `std::shared_ptr<const sluice::shard> source` "
                        "member, copied from the record or sample it is made from, or let them mix with "
                        "`.epochs = sluice::epoch_policy::ignore` in " + stage + "'s options");
        });
    }
}

}  // namespace detail
}  // namespace sluice
