#pragma once
// DLPack export of batches, so PyTorch (torch.from_dlpack), JAX and CuPy take them
// without a copy.
//
// A batch is one contiguous buffer of records. By default it exports as uint8 with shape
// [records, record_bytes] when every record has the same size, else as a flat [bytes].
// A layout gives the trainer's view instead: `{.dtype = sluice::dtypes::f32, .shape =
// {-1, 3, 224, 224}}` (one -1 is inferred); the sizes must account for every byte.
// Strides are given explicitly (row-major, in elements), as older consumers expect.
//
// The tensor holds a reference to the batch's memory: the memory stays valid, and a
// device batch's ring slot stays taken, until the consumer calls the tensor's deleter,
// even after the batch object itself is gone. dlpack_ptr calls the deleter for C++
// callers; `.release()` hands the tensor to a framework, which then owns it.

#include <sluice/core/error.hpp>
#include <sluice/ops/batch.hpp>

#include <dlpack/dlpack.h>

static_assert(DLPACK_VERSION >= 60, "sluice needs DLPack 0.6 or later (Debian: libdlpack-dev)");

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sluice {

namespace dtypes {
inline constexpr DLDataType u8{kDLUInt, 8, 1};
inline constexpr DLDataType i8{kDLInt, 8, 1};
inline constexpr DLDataType i16{kDLInt, 16, 1};
inline constexpr DLDataType i32{kDLInt, 32, 1};
inline constexpr DLDataType i64{kDLInt, 64, 1};
inline constexpr DLDataType f16{kDLFloat, 16, 1};
inline constexpr DLDataType bf16{kDLBfloat, 16, 1};
inline constexpr DLDataType f32{kDLFloat, 32, 1};
inline constexpr DLDataType f64{kDLFloat, 64, 1};
}  // namespace dtypes

/// How a batch's bytes are seen as a tensor.
struct tensor_layout {
    DLDataType dtype = dtypes::u8;
    /// Empty: [records, record_bytes / element] when records are of one size, else flat.
    /// One entry may be -1, inferred from the batch's size.
    std::vector<std::int64_t> shape = {};
};

struct dlpack_deleter {
    void operator()(DLManagedTensor* t) const noexcept {
        if (t && t->deleter) t->deleter(t);
    }
};
/// Owns a DLManagedTensor until released to a consumer.
using dlpack_ptr = std::unique_ptr<DLManagedTensor, dlpack_deleter>;

namespace detail {

inline std::string describe_layout(const tensor_layout& l) {
    std::string s = l.dtype.code == kDLFloat ? "float" : l.dtype.code == kDLBfloat ? "bfloat"
                  : l.dtype.code == kDLInt   ? "int"   : l.dtype.code == kDLUInt   ? "uint" : "type";
    s += std::to_string(l.dtype.bits);
    if (l.dtype.lanes != 1) s += "x" + std::to_string(l.dtype.lanes);
    s += " [";
    for (std::size_t i = 0; i < l.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(l.shape[i]);
    return s + "]";
}

/// The shape `l` gives a buffer of `bytes` bytes holding records at `offsets`.
inline std::vector<std::int64_t> resolve_shape(const tensor_layout& l, std::size_t bytes,
                                               const std::vector<std::uint64_t>& offsets) {
    const std::size_t item = (std::size_t(l.dtype.bits) * l.dtype.lanes + 7) / 8;
    auto fail = [&](const std::string& why) -> std::vector<std::int64_t> {
        throw error("sluice: cannot export a batch of " + std::to_string(bytes) + " bytes as " +
                    describe_layout(l) + ": " + why);
    };
    if (item == 0) return fail("the element type has no size");
    if (l.shape.empty()) {
        const std::size_t n = offsets.empty() ? 0 : offsets.size() - 1;
        bool uniform = n > 0;
        const std::uint64_t first = n ? offsets[1] - offsets[0] : 0;
        for (std::size_t i = 1; uniform && i < n; ++i) uniform = offsets[i + 1] - offsets[i] == first;
        if (uniform && first % item == 0)
            return {std::int64_t(n), std::int64_t(first / item)};
        if (bytes % item) return fail("the size is not a whole number of elements");
        return {std::int64_t(bytes / item)};
    }
    std::vector<std::int64_t> shape = l.shape;
    int infer = -1;
    std::uint64_t known = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1 && infer < 0) {
            infer = int(i);
        } else if (shape[i] < 0) {
            return fail("a dimension is negative (only one may be -1)");
        } else {
            known *= std::uint64_t(shape[i]);
        }
    }
    if (infer >= 0) {
        if (known == 0 || bytes % (known * item)) return fail("the -1 dimension does not divide evenly");
        shape[std::size_t(infer)] = std::int64_t(bytes / (known * item));
    } else if (known * item != bytes) {
        return fail("that is " + std::to_string(known * item) + " bytes");
    }
    return shape;
}

struct dlpack_context {
    DLManagedTensor tensor{};
    std::vector<std::int64_t> shape, strides;
    std::shared_ptr<const void> owner;
};

/// A DLPack tensor over `data` (kept alive by `owner`).
inline dlpack_ptr export_dlpack(void* data, DLDevice device, std::size_t bytes,
                                const std::vector<std::uint64_t>& offsets, const tensor_layout& l,
                                std::shared_ptr<const void> owner) {
    auto ctx = std::make_unique<dlpack_context>();
    ctx->shape = resolve_shape(l, bytes, offsets);
    ctx->strides.assign(ctx->shape.size(), 1);
    for (std::size_t i = ctx->shape.size(); i-- > 1;) ctx->strides[i - 1] = ctx->strides[i] * ctx->shape[i];
    ctx->owner = std::move(owner);
    DLTensor& t = ctx->tensor.dl_tensor;
    t.data = data;
    t.device = device;
    t.ndim = int(ctx->shape.size());
    t.dtype = l.dtype;
    t.shape = ctx->shape.data();
    t.strides = ctx->strides.data();
    t.byte_offset = 0;
    ctx->tensor.manager_ctx = ctx.get();
    ctx->tensor.deleter = [](DLManagedTensor* self) {
        delete static_cast<dlpack_context*>(self->manager_ctx);
    };
    return dlpack_ptr(&ctx.release()->tensor);
}

}  // namespace detail

namespace detail {
/// The layout asked for, or when none is (an empty shape) the batch's own: what the
/// stage that made it says it is (batch_images), else records of bytes.
inline tensor_layout layout_for(const host_batch& b, const tensor_layout& asked) {
    if (!asked.shape.empty() || b.shape.empty()) return asked;
    return {DLDataType{b.dtype_code, b.dtype_bits, 1}, b.shape};
}
}  // namespace detail

/// A host batch as a DLPack CPU tensor (pinned memory is CPU memory to DLPack; PyTorch
/// finds out it is pinned by itself). The tensor keeps the batch's buffer alive. Without
/// a layout, a batch that says what it is (batch_images) exports as that.
inline dlpack_ptr to_dlpack(const host_batch& b, const tensor_layout& layout = {}) {
    auto owner = std::make_shared<const bytes>(b.data);
    return detail::export_dlpack(const_cast<std::byte*>(b.data.data()), DLDevice{kDLCPU, 0}, b.data.size(),
                                 b.offsets, detail::layout_for(b, layout), std::move(owner));
}

/// A batch's labels as a DLPack int64 CPU tensor of shape [N] (batch_images); the tensor
/// owns a copy of them. Throws sluice::error when the batch has none.
inline dlpack_ptr labels_to_dlpack(const host_batch& b) {
    if (b.labels.empty()) throw error("sluice: labels_to_dlpack: the batch has no labels (batch_images gives them)");
    auto owned = std::make_shared<std::vector<std::int64_t>>(b.labels);
    auto* p = owned->data();
    const std::size_t n = owned->size();
    const std::vector<std::uint64_t> offsets = {0, n * sizeof(std::int64_t)};
    return detail::export_dlpack(p, DLDevice{kDLCPU, 0}, n * sizeof(std::int64_t), offsets,
                                 {dtypes::i64, {std::int64_t(n)}}, std::move(owned));
}

}  // namespace sluice
