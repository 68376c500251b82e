#include <sluice/cuda/dlpack.hpp>

#include <catch2/catch.hpp>

#include <cstring>

namespace {
sluice::host_batch batch_of(const std::vector<std::size_t>& sizes) {
    sluice::host_batch b;
    std::size_t total = 0;
    b.offsets.push_back(0);
    for (auto s : sizes) b.offsets.push_back(total += s);
    std::string data(total, '\0');
    for (std::size_t i = 0; i < total; ++i) data[i] = char(i % 251);
    b.data = sluice::bytes::copy_of(data);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        b.sources.push_back(nullptr);
        b.indices.push_back(i);
    }
    return b;
}
std::vector<std::int64_t> vec(const std::int64_t* p, int n) { return {p, p + n}; }
}  // namespace

TEST_CASE("records of one size export as [records, bytes] uint8 with row-major strides", "[dlpack]") {
    auto b = batch_of({12, 12, 12});
    auto t = sluice::to_dlpack(b);
    const DLTensor& d = t->dl_tensor;
    REQUIRE(d.data == b.data.data());
    REQUIRE(d.device.device_type == kDLCPU);
    REQUIRE(d.device.device_id == 0);
    REQUIRE(d.ndim == 2);
    REQUIRE(vec(d.shape, 2) == std::vector<std::int64_t>{3, 12});
    REQUIRE(vec(d.strides, 2) == std::vector<std::int64_t>{12, 1});
    REQUIRE(d.dtype.code == kDLUInt);
    REQUIRE(d.dtype.bits == 8);
    REQUIRE(d.dtype.lanes == 1);
    REQUIRE(d.byte_offset == 0);
}

TEST_CASE("ragged records export flat", "[dlpack]") {
    auto b = batch_of({3, 5, 8});
    auto t = sluice::to_dlpack(b);
    REQUIRE(t->dl_tensor.ndim == 1);
    REQUIRE(t->dl_tensor.shape[0] == 16);
    REQUIRE(t->dl_tensor.strides[0] == 1);
    auto f = sluice::to_dlpack(b, {.dtype = sluice::dtypes::f32});  // 16 bytes: 4 floats
    REQUIRE(f->dl_tensor.shape[0] == 4);
}

TEST_CASE("a layout gives dtype and shape, with one dimension inferred", "[dlpack]") {
    auto b = batch_of({2 * 3 * 4 * 4, 2 * 3 * 4 * 4});  // two 2x3x4 float32 samples... of 96 bytes
    auto t = sluice::to_dlpack(b, {.dtype = sluice::dtypes::f32, .shape = {-1, 2, 3, 4}});
    const DLTensor& d = t->dl_tensor;
    REQUIRE(d.ndim == 4);
    REQUIRE(vec(d.shape, 4) == std::vector<std::int64_t>{2, 2, 3, 4});
    REQUIRE(vec(d.strides, 4) == std::vector<std::int64_t>{24, 12, 4, 1});
    REQUIRE(d.dtype.code == kDLFloat);
    REQUIRE(d.dtype.bits == 32);
    auto h = sluice::to_dlpack(b, {.dtype = sluice::dtypes::bf16, .shape = {8, 12}});
    REQUIRE(h->dl_tensor.dtype.code == kDLBfloat);
    REQUIRE(vec(h->dl_tensor.strides, 2) == std::vector<std::int64_t>{12, 1});
}

TEST_CASE("a layout that does not account for every byte is an error naming both", "[dlpack]") {
    auto b = batch_of({10, 10});
    REQUIRE_THROWS_WITH(sluice::to_dlpack(b, {.dtype = sluice::dtypes::f32, .shape = {2, 3}}),
                        Catch::Contains("cannot export a batch of 20 bytes as float32 [2, 3]: that is 24 bytes"));
    REQUIRE_THROWS_WITH(sluice::to_dlpack(b, {.dtype = sluice::dtypes::f64, .shape = {-1}}),
                        Catch::Contains("does not divide evenly"));
    REQUIRE_THROWS_WITH(sluice::to_dlpack(b, {.shape = {-1, -1}}), Catch::Contains("only one may be -1"));
    REQUIRE_THROWS_WITH(sluice::to_dlpack(batch_of({3, 4}), {.dtype = sluice::dtypes::i16}),
                        Catch::Contains("not a whole number of elements"));
}

TEST_CASE("the tensor keeps the batch's memory alive until its deleter runs", "[dlpack]") {
    sluice::dlpack_ptr t;
    std::string expect;
    {
        auto b = batch_of({100, 100});
        expect = std::string(b.data.view());
        t = sluice::to_dlpack(b);
    }
    REQUIRE(std::memcmp(t->dl_tensor.data, expect.data(), expect.size()) == 0);
    DLManagedTensor* raw = t.release();  // handed to a "framework", which calls the deleter
    raw->deleter(raw);
}
