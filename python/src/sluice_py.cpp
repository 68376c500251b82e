// sluice's Python module, the C++ side (pybind11). Python composes a chain of stage
// specs, each a (name, options) pair with the C++ stage's name and option names
// (python/sluice/__init__.py); build() folds them into one typed sluice source, checking
// at each step that the stage takes what the chain so far gives, and Pipeline runs it.
// Batches are DLPack producers: __dlpack__ hands out a capsule whose deleter keeps the
// batch's memory (and, after to_device, its ring slot) until the consumer drops it.
#include <sluice/image.hpp>
#include <sluice/sluice.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace py = pybind11;

namespace {

using any_source = std::variant<sluice::source<std::string>, sluice::source<sluice::shard>, sluice::source<sluice::chunk>,
                                sluice::source<sluice::record>, sluice::source<sluice::sample>,
                                sluice::source<sluice::image>, sluice::source<sluice::host_batch>,
                                sluice::source<sluice::device_batch>>;

template <class T>
constexpr const char* type_name() {
    if constexpr (std::is_same_v<T, std::string>) return "URLs";
    else if constexpr (std::is_same_v<T, sluice::shard>) return "shards";
    else if constexpr (std::is_same_v<T, sluice::chunk>) return "chunks";
    else if constexpr (std::is_same_v<T, sluice::record>) return "records";
    else if constexpr (std::is_same_v<T, sluice::sample>) return "samples";
    else if constexpr (std::is_same_v<T, sluice::image>) return "images";
    else if constexpr (std::is_same_v<T, sluice::host_batch>) return "batches";
    else return "device batches";
}

/// Options of one stage, read by name with the C++ option's type; a name the stage does
/// not know is an error (a typo must not pass silently).
class options {
public:
    /// `part`: the option of the stage these are the fields of (fetch's "cache"), if any.
    options(std::string stage, py::dict d, std::string part = {})
        : stage_(std::move(stage)), part_(std::move(part)), d_(std::move(d)) {}
    template <class T>
    void get(const char* name, T& into) {
        used_.push_back(name);
        if (d_.contains(name) && !d_[name].is_none()) into = d_[name].cast<T>();
    }
    template <class T>
    void get(const char* name, std::optional<T>& into) {
        used_.push_back(name);
        if (d_.contains(name) && !d_[name].is_none()) into = d_[name].cast<T>();
    }
    void done() const {
        for (auto item : d_) {
            const auto k = item.first.cast<std::string>();
            if (std::find(used_.begin(), used_.end(), k) == used_.end())
                throw py::type_error("sluice." + stage_ + "()" + (part_.empty() ? "" : "'s " + part_) +
                                     " has no option '" + k + "'");
        }
    }

private:
    std::string stage_;
    std::string part_;
    py::dict d_;
    std::vector<std::string> used_;
};

/// `order="ordered"|"unordered"`: the C++ `.order` (sluice::ordering).
void order_opt(options& o, sluice::ordering& into) {
    std::optional<std::string> v;
    o.get("order", v);
    if (!v) return;
    if (*v != "ordered" && *v != "unordered") throw py::value_error("order is 'ordered' or 'unordered', not '" + *v + "'");
    into = *v == "ordered" ? sluice::ordering::ordered : sluice::ordering::unordered;
}

/// `v` seconds (a number, as Python's time functions take them) as the C++ option `name`'s
/// std::chrono type D: rounded to D's unit, and at least one unit where above 0 (`stall`
/// is whole seconds: 0.4 is 1 s, not 0, which is no limit).
template <class D>
D seconds_as(const std::string& name, double v) {
    if (!std::isfinite(v) || v < 0 || v > 1e9)
        throw py::value_error(name + " is seconds, from 0 to 1e9, not " + std::to_string(v));
    const D d = std::chrono::round<D>(std::chrono::duration<double>(v));
    return v > 0 && d == D::zero() ? D(1) : d;
}
/// The option `name` in seconds, where given (seconds_as).
template <class Rep, class Period>
void seconds_opt(options& o, const char* name, std::chrono::duration<Rep, Period>& into) {
    std::optional<double> v;
    o.get(name, v);
    if (v) into = seconds_as<std::chrono::duration<Rep, Period>>(name, *v);
}

/// fetch(cache={...}): sluice::cache_options by the C++ names, its durations in seconds.
/// Warnings (a copy that could not be written) go to stderr, as the C++ default has it.
sluice::cache_options cache_opts(const py::object& v) {
    if (!py::isinstance<py::dict>(v))
        throw py::type_error("sluice.fetch()'s cache is a dict of cache_options by name, e.g. {'dir': '/nvme/cache', "
                             "'max_bytes': 500 << 30}, not " +
                             py::str(v.get_type().attr("__name__")).cast<std::string>());
    options o("fetch", py::reinterpret_borrow<py::dict>(v), "cache");
    sluice::cache_options c;
    py::object dir = py::none();
    o.get("dir", dir);
    if (!dir.is_none()) c.dir = py::module_::import("os").attr("fspath")(dir).cast<std::string>();  // str or path-like
    if (c.dir.empty())
        throw py::value_error("sluice.fetch()'s cache needs 'dir', the directory of the copies (an empty one is made)");
    o.get("max_bytes", c.max_bytes);
    o.get("chunk_size", c.chunk_size);
    o.get("map", c.map);
    seconds_opt(o, "stale_after", c.stale_after);
    seconds_opt(o, "rescan_after", c.rescan_after);
    o.done();
    return c;
}

sluice::decode_options decode_opts(options& o) {
    sluice::decode_options d;
    std::string corrupt = "error";
    o.get("on_corrupt", corrupt);
    if (corrupt != "error" && corrupt != "skip") throw py::value_error("on_corrupt is 'error' or 'skip', not '" + corrupt + "'");
    d.on_corrupt = corrupt == "skip" ? sluice::on_corrupt::skip : sluice::on_corrupt::error;
    o.get("verify", d.verify);
    o.get("max_record_bytes", d.max_record_bytes);
    return d;
}

/// Appends the stage `name` to `s`, or throws TypeError naming what it takes and what
/// the chain gives.
/// to_device(device=N) in a module built without the CUDA toolkit: a DeviceError.
struct no_cuda_build : sluice::error {
    using sluice::error::error;
};

/// A Python callable shared by map's workers: copied between C++ threads without the GIL,
/// its last reference dropped with it.
using py_fn = std::shared_ptr<py::object>;
py_fn share_fn(py::object f) {
    return py_fn(new py::object(std::move(f)), [](py::object* o) {
        py::gil_scoped_acquire gil;
        delete o;
    });
}

/// map(fn) on records: fn(bytes) -> bytes-like, called on the CPU pool holding the GIL
/// only while it runs. A Python exception becomes a sluice::error carrying its traceback's
/// text and the record's key, and reaches the loop after the batches before it.
sluice::record call_map(const py_fn& fn, sluice::record r) {
    std::string out;
    {
        py::gil_scoped_acquire gil;
        try {
            py::object got = (*fn)(py::bytes(reinterpret_cast<const char*>(r.data.data()), r.data.size()));
            if (!py::isinstance<py::bytes>(got) && !py::isinstance<py::bytearray>(got) &&
                !py::isinstance<py::memoryview>(got))
                throw sluice::error("sluice: map: the Python function returned " +
                                    std::string(py::str(got.get_type().attr("__name__"))) + " for record " + r.key() +
                                    ", not bytes");
            out = py::bytes(got);
        } catch (py::error_already_set& e) {
            std::string text = e.what();
            try {
                py::object fmt = py::module_::import("traceback").attr("format_exception");
                text.clear();
                for (auto line : fmt(e.type(), e.value(), e.trace())) text += py::str(line).cast<std::string>();
            } catch (...) {  // keep what() if the traceback cannot be formatted
            }
            throw sluice::error("sluice: map: the Python function raised on record " + r.key() + ":\n" + text);
        }
    }
    auto buf = std::make_shared<sluice::buffer>(out.size() ? out.size() : 1);
    std::memcpy(buf->data(), out.data(), out.size());
    r.data = sluice::bytes(std::move(buf), out.size());
    return r;
}

/// What the chain made that the Pipeline reports on: to_device's engine.
struct built {
    std::shared_ptr<sluice::host_engine> engine;
};

template <class T>
any_source append(sluice::source<T> s, const std::string& name, options& o, built& b) {
    auto wrong = [&](const char* takes) -> any_source {
        throw py::type_error("sluice." + name + "() takes " + takes + ", but the chain before it gives " + type_name<T>());
    };
    if (name == "plan") {
        if constexpr (!std::is_same_v<T, std::string>) return wrong("URLs (list())");
        else {
            sluice::plan_options p;
            o.get("epochs", p.epochs);
            o.get("seed", p.seed);
            o.get("rank", p.rank);
            o.get("world", p.world);
            // The counts file by its path (sluice::read_record_counts); without one, plan
            // counts the records itself where ranks need them, kept in counts_dir.
            std::string counts;
            o.get("counts", counts);
            if (!counts.empty()) p.counts = sluice::read_record_counts(counts);
            o.get("counts_dir", p.counts_dir);
            o.done();
            return std::move(s) | sluice::plan(p);
        }
    }
    if (name == "read" || name == "fetch") {
        if constexpr (!std::is_same_v<T, sluice::shard>) return wrong("shards (plan())");
        else if (name == "read") {
            sluice::read_options r;
            o.get("chunk_size", r.chunk_size);
            o.get("concurrency", r.concurrency);
            o.get("map", r.map);
            o.get("map_min_bytes", r.map_min_bytes);
            order_opt(o, r.order);
            o.done();
            return std::move(s) | sluice::read(r);
        } else {
            sluice::fetch_options f;
            o.get("concurrency", f.concurrency);
            o.get("chunk_size", f.chunk_size);
            o.get("parallel_parts", f.parallel_parts);
            o.get("part_size", f.part_size);
            o.get("max_part_size", f.max_part_size);
            o.get("parts_in_flight", f.parts_in_flight);
            o.get("parallel_parts_below_bytes_per_s", f.parallel_parts_below_bytes_per_s);
            o.get("retries", f.retries);
            o.get("max_redirects", f.max_redirects);
            o.get("ca_file", f.ca_file);
            o.get("insecure", f.insecure);
            o.get("min_concurrency", f.min_concurrency);
            o.get("shared_limit", f.shared_limit);
            seconds_opt(o, "backoff_base", f.backoff_base);
            seconds_opt(o, "backoff_cap", f.backoff_cap);
            seconds_opt(o, "stall", f.stall);
            seconds_opt(o, "connect_timeout", f.connect_timeout);
            py::object cache = py::none();
            o.get("cache", cache);
            if (!cache.is_none()) f.cache = cache_opts(cache);
            order_opt(o, f.order);
            o.done();
            return std::move(s) | sluice::fetch(f);
        }
    }
    if (name == "raw" || name == "tar" || name == "tfrecord" || name == "recordio" || name == "lines" ||
        name == "webdataset") {
        if constexpr (!std::is_same_v<T, sluice::chunk>) return wrong("chunks (read() or fetch())");
        else {
            auto d = decode_opts(o);
            o.done();
            if (name == "raw") return std::move(s) | sluice::raw(d);
            if (name == "tar") return std::move(s) | sluice::tar(d);
            if (name == "tfrecord") return std::move(s) | sluice::tfrecord(d);
            if (name == "recordio") return std::move(s) | sluice::recordio(d);
            if (name == "lines") return std::move(s) | sluice::lines(d);
            return std::move(s) | sluice::webdataset(d);
        }
    }
    if (name == "map") {
        if constexpr (!std::is_same_v<T, sluice::record>) return wrong("records (raw(), tar(), lines(), ...)");
        else {
            py::object f = py::none();
            sluice::map_options m;
            o.get("fn", f);
            o.get("concurrency", m.concurrency);
            order_opt(o, m.order);
            o.done();
            if (!PyCallable_Check(f.ptr())) throw py::type_error("sluice.map() takes a callable: map(fn, ...)");
            return std::move(s) | sluice::map([fn = share_fn(std::move(f))](sluice::record r) {
                       return call_map(fn, std::move(r));
                   }, m);
        }
    }
    if (name == "decode_images") {
        if constexpr (!std::is_same_v<T, sluice::record> && !std::is_same_v<T, sluice::sample>)
            return wrong("records or samples (raw(), tar(), webdataset())");
        else {
            sluice::image_options i;
            std::string mode = "train", corrupt = "error";
            o.get("mode", mode);
            if (mode != "train" && mode != "eval") throw py::value_error("mode is 'train' or 'eval', not '" + mode + "'");
            i.mode = mode == "train" ? sluice::image_mode::train : sluice::image_mode::eval;
            o.get("size", i.size);
            o.get("resize", i.resize);
            o.get("flip", i.flip);
            o.get("seed", i.seed);
            o.get("fields", i.fields);
            o.get("label_field", i.label_field);
            o.get("label_key", i.label_key);
            o.get("max_pixels", i.max_pixels);
            o.get("on_corrupt", corrupt);
            i.on_corrupt = corrupt == "skip" ? sluice::on_corrupt::skip : sluice::on_corrupt::error;
            o.get("concurrency", i.concurrency);
            o.done();
            return std::move(s) | sluice::decode_images(i);
        }
    }
    if (name == "shuffle") {
        if constexpr (!std::is_same_v<T, sluice::record> && !std::is_same_v<T, sluice::sample> &&
                      !std::is_same_v<T, sluice::image>)
            return wrong("records, samples or images");
        else {
            sluice::shuffle_options sh;
            o.get("buffer", sh.buffer);
            o.get("seed", sh.seed);
            o.done();
            return std::move(s) | sluice::shuffle(sh);
        }
    }
    if (name == "batch") {
        if constexpr (!std::is_same_v<T, sluice::record>) return wrong("records");
        else {
            sluice::batch_options b;
            o.get("size", b.size);
            o.get("drop_last", b.drop_last);
            o.get("concurrency", b.concurrency);  // 0 (default): automatic, see batch_options
            o.done();
            return std::move(s) | sluice::batch(b);
        }
    }
    if (name == "batch_images") {
        if constexpr (!std::is_same_v<T, sluice::image>) return wrong("images (decode_images())");
        else {
            sluice::image_batch_options b;
            std::string layout = "nchw", dtype = "uint8";
            o.get("size", b.size);
            o.get("drop_last", b.drop_last);
            o.get("layout", layout);
            o.get("dtype", dtype);
            o.get("mean", b.mean);
            o.get("std", b.std);
            o.done();
            if (layout != "nchw" && layout != "nhwc") throw py::value_error("layout is 'nchw' or 'nhwc', not '" + layout + "'");
            if (dtype != "uint8" && dtype != "float32")
                throw py::value_error("dtype is 'uint8' or 'float32', not '" + dtype + "'");
            b.layout = layout == "nchw" ? sluice::tensor_layout_kind::nchw : sluice::tensor_layout_kind::nhwc;
            b.dtype = dtype == "uint8" ? sluice::pixel_type::uint8 : sluice::pixel_type::float32;
            return std::move(s) | sluice::batch_images(b);
        }
    }
    if (name == "to_device") {
        if constexpr (!std::is_same_v<T, sluice::host_batch>) return wrong("batches (batch(), batch_images())");
        else {
            sluice::to_device_options t;
            std::optional<int> device;
            o.get("ring", t.ring);
            o.get("device", device);
            o.done();
            if (device) {  // a CUDA device: fails at start, naming the CUDA error, without one
#if defined(SLUICE_HAVE_CUDA)
                t.device = *device;
                return std::move(s) | sluice::to_device(t, std::make_shared<sluice::cuda_engine>(*device));
#else
                throw no_cuda_build("sluice: to_device(device=" + std::to_string(*device) +
                                    "): this sluice module was built without the CUDA toolkit; leave device "
                                    "out for host memory");
#endif
            }
            // No device: host memory (the host engine), what CPU PyTorch takes.
            b.engine = std::make_shared<sluice::host_engine>();
            return std::move(s) | sluice::to_device(t, b.engine);
        }
    }
    throw py::value_error("sluice has no stage '" + name + "'");
}

any_source build(const py::list& specs, built& b) {
    if (specs.empty()) throw py::value_error("an empty chain: start it with sluice.list(...)");
    auto first = specs[0].cast<py::tuple>();
    if (first[0].cast<std::string>() != "list") throw py::value_error("a pipeline starts with sluice.list(...)");
    options lo("list", first[1].cast<py::dict>());
    std::vector<std::string> patterns;
    lo.get("patterns", patterns);
    lo.done();
    any_source s = sluice::list(patterns);
    for (std::size_t i = 1; i < specs.size(); ++i) {
        auto spec = specs[i].cast<py::tuple>();
        const auto name = spec[0].cast<std::string>();
        options o(name, spec[1].cast<py::dict>());
        s = std::visit([&](auto src) { return append(std::move(src), name, o, b); }, std::move(s));
    }
    return s;
}

/// One tensor of a batch, as a DLPack producer: the batch's data (`images` of an image
/// batch) or its labels. Holds the batch alive until the capsule's consumer lets go.
struct tensor_view {
    std::shared_ptr<const void> owner;      // keeps the batch (and its slot) alive
    std::function<sluice::dlpack_ptr()> export_;
    std::vector<std::int64_t> shape;
    std::string dtype;
    std::uintptr_t data = 0;
    int device_type = kDLCPU, device_id = 0;  // where the tensor's memory is

    py::capsule dlpack(py::object /*stream*/) const {
        sluice::dlpack_ptr t = export_();
        // The DLPack protocol: a capsule named "dltensor"; the consumer renames it
        // "used_dltensor" and calls the deleter itself. Unconsumed, ours calls it.
        return py::capsule(t.release(), "dltensor", [](PyObject* cap) {
            if (PyCapsule_IsValid(cap, "dltensor")) {
                auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
                if (m && m->deleter) m->deleter(m);
            }
        });
    }
};

std::string dtype_of(const DLDataType& t) {
    const char* base = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : "other";
    return base + std::to_string(t.bits);
}

tensor_view view_of(std::shared_ptr<const void> owner, std::function<sluice::dlpack_ptr()> f) {
    tensor_view v{std::move(owner), std::move(f), {}, {}, 0};
    auto t = v.export_();
    v.shape.assign(t->dl_tensor.shape, t->dl_tensor.shape + t->dl_tensor.ndim);
    v.dtype = dtype_of(t->dl_tensor.dtype);
    v.data = reinterpret_cast<std::uintptr_t>(t->dl_tensor.data);
    v.device_type = int(t->dl_tensor.device.device_type);
    v.device_id = int(t->dl_tensor.device.device_id);
    return v;
}

/// A batch handed to Python: host (batch(), batch_images()) or from to_device.
struct py_batch {
    std::shared_ptr<sluice::host_batch> host;
    std::shared_ptr<sluice::device_batch> device;

    const sluice::host_batch& h() const { return device ? device->host() : *host; }
    std::shared_ptr<const void> owner() const {
        return device ? std::shared_ptr<const void>(device) : std::shared_ptr<const void>(host);
    }
    tensor_view data() const {
        if (device) {
            auto d = device;
            return view_of(d, [d] {
                d->synchronize();
                return d->dlpack();
            });
        }
        auto hb = host;
        return view_of(hb, [hb] { return sluice::to_dlpack(*hb); });
    }
    tensor_view labels() const {
        auto o = owner();
        const sluice::host_batch* hb = &h();
        return view_of(o, [o, hb] { return sluice::labels_to_dlpack(*hb); });
    }
};

using any_pipeline = std::variant<std::unique_ptr<sluice::pipeline<sluice::host_batch>>,
                                  std::unique_ptr<sluice::pipeline<sluice::device_batch>>>;

/// Runs a chain; next() waits with the GIL released and looks for Ctrl-C (or any Python
/// signal handler's exception) every 100 ms, stopping the pipeline when one is raised.
class py_pipeline {
public:
    py_pipeline(const py::list& specs, const std::string& resume, unsigned threads, const py::dict& metrics,
                const std::string& trace, bool tune, std::uint64_t memory) {
        sluice::pipeline_options po{
            .runtime = {.cpu_threads = threads}, .resume = resume, .tune = tune, .memory = memory, .trace = trace};
        // metrics={"file": ..., "port": ..., "interval": seconds}: C++'s metrics_options.
        for (auto [k, v] : metrics) {
            const auto key = py::cast<std::string>(k);
            if (key == "file") po.metrics.file = py::cast<std::string>(v);
            else if (key == "port") po.metrics.port = py::cast<int>(v);
            else if (key == "interval")
                po.metrics.interval = seconds_as<decltype(po.metrics.interval)>("metrics' interval", py::cast<double>(v));
            else throw py::type_error("metrics takes file, port and interval, not '" + key + "'");
        }
        std::visit(
            [&](auto src) {
                using S = decltype(src);
                using T = typename S::output_type;
                if constexpr (std::is_same_v<T, sluice::host_batch> || std::is_same_v<T, sluice::device_batch>)
                    p_ = std::make_unique<sluice::pipeline<T>>(std::move(src), po);
                else
                    throw py::type_error(std::string("a Python pipeline ends in batches (batch(), batch_images(), "
                                                     "to_device()), not ") + type_name<T>());
            },
            build(specs, built_));
    }
    // Without the GIL: map's workers may be waiting for it, and stop() joins them.
    ~py_pipeline() {
        py::gil_scoped_release nogil;
        stop();
        std::visit([](auto& p) { p.reset(); }, p_);
    }

    py::object next() {
        // The wait runs on a thread of its own so this one can look for signals.
        struct shared {
            std::mutex m;
            std::condition_variable cv;
            bool done = false;
            std::optional<py_batch> got;
            std::exception_ptr error;
        };
        auto sh = std::make_shared<shared>();
        std::thread waiter([this, sh] {
            std::optional<py_batch> b;
            std::exception_ptr e;
            try {
                std::visit(
                    [&](auto& p) {
                        if (auto v = p->next_blocking()) {
                            py_batch pb;
                            if constexpr (std::is_same_v<std::decay_t<decltype(*v)>, sluice::host_batch>)
                                pb.host = std::make_shared<sluice::host_batch>(std::move(*v));
                            else
                                pb.device = std::make_shared<sluice::device_batch>(std::move(*v));
                            b = std::move(pb);
                        }
                    },
                    p_);
            } catch (...) {
                e = std::current_exception();
            }
            std::lock_guard lock(sh->m);
            sh->got = std::move(b);
            sh->error = e;
            sh->done = true;
            sh->cv.notify_all();
        });
        bool interrupted = false;
        for (;;) {
            {
                py::gil_scoped_release nogil;
                std::unique_lock lock(sh->m);
                if (sh->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return sh->done; })) break;
            }
            if (PyErr_CheckSignals() != 0) {  // KeyboardInterrupt and the like: stop, then raise
                interrupted = true;
                {
                    py::gil_scoped_release nogil;
                    stop();
                }
                break;
            }
        }
        {
            py::gil_scoped_release nogil;
            waiter.join();
        }
        if (interrupted) throw py::error_already_set();
        if (sh->error) std::rethrow_exception(sh->error);
        if (!sh->got) throw py::stop_iteration();
        return py::cast(std::move(*sh->got));
    }

    void stop() {
        std::visit([](auto& p) { if (p) p->stop(); }, p_);
    }
    py::bytes state() {
        return std::visit([](auto& p) { return py::bytes(p->state()); }, p_);
    }
    int metrics_port() {
        return std::visit([](auto& p) { return p->metrics_port(); }, p_);
    }
    std::string figures_json() const {
        return std::visit([](auto& p) { return p->figures().json(); }, p_);
    }
    std::string table() const {
        return std::visit([](auto& p) { return p->figures().table(); }, p_);
    }
    /// to_device's memory: the ring's buffers, in use (held by batches or tensors) or free.
    py::dict memory() const {
        py::dict d;
        if (!built_.engine) return d;
        const auto f = built_.engine->destination_pool()->figures();
        d["reserved_bytes"] = f.reserved_bytes;
        d["in_use_bytes"] = f.in_use_bytes;
        d["free_bytes"] = f.free_bytes;
        d["allocations"] = f.allocations;
        return d;
    }

private:
    built built_;  // before p_: the pipeline is stopped and destroyed first
    any_pipeline p_;
};

}  // namespace

PYBIND11_MODULE(_sluice, m) {
    m.doc() = "sluice's C++ core; use the sluice package";
    // One class per kind of failure, by the error's std::error_code category; the text is
    // the C++ library's, and `code` (with `url` and `offset` for a source) is set.
    static py::exception<sluice::error> error_t(m, "Error", PyExc_RuntimeError);
    static py::exception<sluice::source_error> source_t(m, "SourceError", error_t.ptr());
    static py::exception<sluice::source_error> http_t(m, "HTTPError", source_t.ptr());
    static py::exception<sluice::source_error> network_t(m, "NetworkError", source_t.ptr());
    static py::exception<sluice::source_error> compressed_t(m, "DecompressError", source_t.ptr());
    static py::exception<sluice::error> device_t(m, "DeviceError", error_t.ptr());
    py::register_exception_translator([](std::exception_ptr p) {
        auto raise = [](PyObject* type, const sluice::error& e, const sluice::source_error* src) {
            py::object x = py::reinterpret_borrow<py::object>(type)(e.what());
            x.attr("code") = e.code().value();
            x.attr("category") = e.code() ? std::string(e.code().category().name()) : std::string();
            if (src) {
                x.attr("url") = src->url();
                x.attr("offset") = src->offset() == sluice::source_error::npos ? py::object(py::none()) : py::int_(src->offset());
            }
            PyErr_SetObject(type, x.ptr());
        };
        try {
            if (p) std::rethrow_exception(p);
        } catch (const no_cuda_build& e) {
            raise(device_t.ptr(), e, nullptr);
        } catch (const sluice::source_error& e) {
            const std::string cat = e.code() ? e.code().category().name() : "";
            PyObject* t = cat == "http" ? http_t.ptr() : cat == "curl" ? network_t.ptr() : cat == "zlib" ? compressed_t.ptr()
                                                                                                              : source_t.ptr();
            raise(t, e, &e);
        } catch (const sluice::error& e) {
            const std::string cat = e.code() ? e.code().category().name() : "";
            raise(cat == "cuda" ? device_t.ptr() : error_t.ptr(), e, nullptr);
        }
    });

    py::class_<tensor_view>(m, "Tensor")
        .def("__dlpack__", &tensor_view::dlpack, py::arg("stream") = py::none())
        .def("__dlpack_device__", [](const tensor_view& v) { return py::make_tuple(v.device_type, v.device_id); })
        .def_readonly("shape", &tensor_view::shape)
        .def_readonly("dtype", &tensor_view::dtype)
        .def_readonly("data_ptr", &tensor_view::data);

    py::class_<py_batch>(m, "Batch")
        .def_property_readonly("data", &py_batch::data)
        .def_property_readonly("images", &py_batch::data)
        .def_property_readonly("labels", &py_batch::labels)
        .def("__dlpack__", [](const py_batch& b, py::object s) { return b.data().dlpack(s); }, py::arg("stream") = py::none())
        .def("__dlpack_device__", [](const py_batch& b) -> py::tuple {  // from the batch, not an export
            // Both arms one type: pybind11 3's make_tuple types its tuple by its arguments.
            const int d = b.device ? b.device->device() : -1;
            if (d < 0) return py::make_tuple(int(kDLCPU), 0);
            return py::make_tuple(int(kDLCUDA), d);
        })
        .def("__len__", [](const py_batch& b) { return b.h().size(); })
        .def("key", [](const py_batch& b, std::size_t i) {
            if (i >= b.h().size()) throw py::index_error("record " + std::to_string(i) + " of a batch of " + std::to_string(b.h().size()));
            return b.h().key(i);
        })
        .def("record", [](const py_batch& b, std::size_t i) {
            const auto& h = b.h();
            if (i >= h.size()) throw py::index_error("record " + std::to_string(i) + " of a batch of " + std::to_string(h.size()));
            return py::bytes(reinterpret_cast<const char*>(h.data.data()) + h.offsets[i], h.offsets[i + 1] - h.offsets[i]);
        });

    py::class_<py_pipeline>(m, "Pipeline")
        .def(py::init<const py::list&, const std::string&, unsigned, const py::dict&, const std::string&, bool,
                      std::uint64_t>(),
             py::arg("specs"), py::arg("resume") = "", py::arg("cpu_threads") = 0, py::arg("metrics") = py::dict(),
             py::arg("trace") = "", py::arg("tune") = false, py::arg("memory") = 0)
        .def("metrics_port", &py_pipeline::metrics_port, py::call_guard<py::gil_scoped_release>())
        .def("next", &py_pipeline::next)
        .def("stop", &py_pipeline::stop, py::call_guard<py::gil_scoped_release>())
        .def("state", &py_pipeline::state)
        .def("figures_json", &py_pipeline::figures_json)
        .def("table", &py_pipeline::table)
        .def("memory", &py_pipeline::memory);
    m.def(
        "merge_states",
        [](const std::vector<std::string>& states) { return py::bytes(sluice::merge_states(states)); },
        py::arg("states"));
}
