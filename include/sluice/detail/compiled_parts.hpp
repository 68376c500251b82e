#pragma once
// The opt-in compiled part (CMake target sluice::compiled, README "Build time").
//
// Every stage factory and pipeline<T> is a template, compiled in each translation unit
// that uses it: the worker coroutines, channels and stage machinery behind a small
// pipeline cost a user's TU 20-25 CPU-seconds at -O0. Linking sluice::compiled defines
// SLUICE_COMPILED, and <sluice/sluice.hpp> then declares the instantiations below
// `extern`: a user's TU only refers to them, and src/compiled.cpp compiles them once. A
// user's own types (map's function, batch's collate, pipelines of their items) are still
// compiled where they are used.
//
// Included at the end of <sluice/sluice.hpp>; the list is the one place both sides use.

#include <sluice/sluice.hpp>

#define SLUICE_COMPILED_PARTS(X)                                                     \
    X(source<std::string> list<void>(std::string, s3_options))                       \
    X(source<std::string> list<void>(std::vector<std::string>, s3_options))          \
    X(stage<std::string, shard> plan<void>(plan_options))                            \
    X(stage<shard, chunk> read<void>(read_options))                                  \
    X(stage<shard, chunk> fetch<void>(fetch_options))                                \
    X(stage<chunk, chunk> gunzip<void>(gzip_options))                                \
    X(stage<chunk, record> lines<void>(decode_options))                              \
    X(stage<chunk, record> raw<void>(decode_options))                                \
    X(stage<chunk, record> tar<void>(decode_options))                                \
    X(stage<chunk, sample> webdataset<void>(decode_options))                         \
    X(stage<chunk, record> tfrecord<void>(decode_options))                           \
    X(stage<chunk, record> recordio<void>(decode_options))                           \
    X(stage<record, host_batch> batch<void>(batch_options))                          \
    X(stage<host_batch, device_batch> to_device<void>(to_device_options, std::shared_ptr<copy_engine>)) \
    X(stage<record, record> detail::shuffle_stage<record>(shuffle_options))          \
    X(stage<sample, sample> detail::shuffle_stage<sample>(shuffle_options))          \
    X(class pipeline<record>)                                                        \
    X(class pipeline<sample>)                                                        \
    X(class pipeline<host_batch>)                                                    \
    X(class pipeline<device_batch>)

#if defined(SLUICE_COMPILED) && !defined(SLUICE_COMPILING)
namespace sluice {
#define SLUICE_EXTERN_PART(...) extern template __VA_ARGS__;
SLUICE_COMPILED_PARTS(SLUICE_EXTERN_PART)
#undef SLUICE_EXTERN_PART
}  // namespace sluice
#endif
