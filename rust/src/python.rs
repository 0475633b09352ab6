//! Python bindings (`iqtrain._native`). Every input is validated here or in the pure-Rust core
//! and reported as an `iqtrain.errors` exception; no panic is allowed to reach Python.

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::ndarray::ArrayView3;
use numpy::{Element, PyArray1, PyArray3, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::{
    bytes_mut, AlignedVec, Buffer, BufferPool, Dataset, Error, Layout, Piece, Plain, RawBuf,
    ReadPolicy, Run, Storage, Stream,
};

pyo3::import_exception!(iqtrain.errors, IQTrainError);
pyo3::import_exception!(iqtrain.errors, DataError);
pyo3::import_exception!(iqtrain.errors, CursorMismatchError);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let msg = e.to_string();
        match e {
            Error::Data { .. }
            | Error::LengthChanged { .. }
            | Error::Replaced { .. }
            | Error::NoWindows { .. } => DataError::new_err(msg),
            Error::CursorMismatch(_) => CursorMismatchError::new_err(msg),
            // A bad argument or a call out of turn: the Python caller's mistake.
            Error::Config { .. } => PyValueError::new_err(msg),
            Error::Index { .. } => PyIndexError::new_err(msg),
            Error::Alloc { .. } => PyMemoryError::new_err(msg),
            Error::Thread(_) | Error::Internal(_) => IQTrainError::new_err(msg),
        }
    }
}

/// A non-negative integer argument (`i128` so negatives arrive here and get a named error).
fn uint(key: &str, v: i128) -> Result<u64, Error> {
    u64::try_from(v).map_err(|_| {
        Error::config(
            key,
            format!("must be a non-negative integer below 2^64, got {v}"),
        )
    })
}

fn positive(key: &str, v: i128) -> Result<u64, Error> {
    match u64::try_from(v) {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(Error::config(
            key,
            format!("must be an integer >= 1, got {v}"),
        )),
    }
}

/// An index argument; negative or too large ints are IndexError, non-ints TypeError.
fn index_arg(obj: &Bound<'_, PyAny>, what: &'static str, len: u64) -> PyResult<u64> {
    match obj.extract::<u64>() {
        Ok(i) if i < len => Ok(i),
        Ok(i) => Err(Error::Index {
            what,
            index: i,
            len,
        }
        .into()),
        Err(e) => match obj.extract::<i128>() {
            Ok(i) => Err(PyIndexError::new_err(format!(
                "{what} {i} is out of range [0, {len})"
            ))),
            Err(_) => Err(e),
        },
    }
}

/// "numpy array of dtype D and shape S" or the type name, for error messages.
fn describe(obj: &Bound<'_, PyAny>) -> String {
    let attr = |name: &str| {
        obj.getattr(name)
            .and_then(|a| a.str())
            .map(|s| s.to_string())
    };
    match (attr("dtype"), attr("shape")) {
        (Ok(d), Ok(s)) => format!("an array of dtype {d} and shape {s}"),
        _ => obj
            .get_type()
            .name()
            .map(|n| {
                let an = n
                    .to_str()
                    .is_ok_and(|n| n.starts_with(['a', 'e', 'i', 'o', 'u']));
                format!("{} {n}", if an { "an" } else { "a" })
            })
            .unwrap_or_else(|_| "an unknown object".into()),
    }
}

/// Window ids from a 1-D uint64 (or non-negative int64) array.
fn ids_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        let r = a
            .try_readonly()
            .map_err(|e| Error::config("ids", e.to_string()))?;
        return Ok(r.as_array().iter().copied().collect());
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        let r = a
            .try_readonly()
            .map_err(|e| Error::config("ids", e.to_string()))?;
        return r
            .as_array()
            .iter()
            .map(|&i| {
                u64::try_from(i).map_err(|_| {
                    PyIndexError::new_err(format!("window id {i} is out of range (negative)"))
                })
            })
            .collect();
    }
    Err(Error::config(
        "ids",
        format!("must be a 1-D numpy uint64 array, got {}", describe(obj)),
    )
    .into())
}

/// A selection's base window ids: a 1-D numpy uint64 (or non-negative int64) array, or a
/// sequence of non-negative ints. A negative id is an IndexError, any other type a ValueError.
fn select_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let negative = |i: i128| {
        PyIndexError::new_err(format!("selected window id {i} is out of range (negative)"))
    };
    let readonly = |e: numpy::BorrowError| Error::config("select", e.to_string());
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        return Ok(a.try_readonly().map_err(readonly)?.as_array().to_vec());
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        let r = a.try_readonly().map_err(readonly)?;
        return r
            .as_array()
            .iter()
            .map(|&i| u64::try_from(i).map_err(|_| negative(i.into())))
            .collect();
    }
    let bad = || -> PyErr {
        Error::config(
            "select",
            format!(
                "must be a 1-D numpy uint64 array or a sequence of ints (window ids), got {}",
                describe(obj)
            ),
        )
        .into()
    };
    // Any other array (another dtype, another shape) is refused rather than cast.
    if obj.cast::<numpy::PyUntypedArray>().is_ok() || obj.is_instance_of::<pyo3::types::PyString>()
    {
        return Err(bad());
    }
    let ids: Vec<i128> = obj.extract().map_err(|_| bad())?;
    ids.into_iter()
        .map(|i| {
            u64::try_from(i).map_err(|_| {
                if i < 0 {
                    negative(i)
                } else {
                    PyIndexError::new_err(format!(
                        "selected window id {i} is out of range (not below 2^64)"
                    ))
                }
            })
        })
        .collect()
}

/// Hands a batch buffer to numpy without copying; when numpy frees the array, `release` gets
/// the buffer back (to return it to a stream's pool, or to drop it).
fn aligned_to_numpy<T, F>(
    py: Python<'_>,
    v: AlignedVec<T>,
    window: usize,
    release: F,
) -> PyResult<Bound<'_, PyAny>>
where
    T: Element + Plain + Send + 'static,
    F: FnOnce(AlignedVec<T>) + Send + 'static,
{
    let shape = (v.len().checked_div(2 * window).unwrap_or(0), window, 2);
    if shape.0 * window * 2 != v.len() {
        return Err(
            Error::Internal(format!("batch of {} elements is not {shape:?}", v.len())).into(),
        );
    }
    // The heap block does not move when the buffer moves into the capsule.
    let ptr = v.as_ptr();
    let owner =
        PyCapsule::new_with_value_and_destructor(py, v, c"iqtrain._native.batch", move |v, _| {
            release(v)
        })?;
    // SAFETY: `ptr` is the start of `v`'s heap block: 64-byte aligned (enough for T), holding
    // v.len() = shape.0 * window * 2 initialised T (checked above) in C order, which the default
    // strides of from_shape_ptr describe. The block moved with `v` into `owner` (a move leaves
    // the block where it is), and borrow_from_array makes `owner` the array's base object, so
    // the memory lives until numpy frees the array and only then goes to `release`. Rust does
    // not touch the buffer meanwhile: the capsule only holds it, and `view` is gone when this
    // returns, leaving numpy's array the one way to it.
    unsafe {
        let view = ArrayView3::from_shape_ptr(shape, ptr);
        Ok(PyArray3::borrow_from_array(&view, owner.into_any()).into_any())
    }
}

fn buffer_to_numpy(py: Python<'_>, buf: Buffer, window: usize) -> PyResult<Bound<'_, PyAny>> {
    match buf {
        Buffer::I8(v) => aligned_to_numpy(py, v, window, drop),
        Buffer::I16(v) => aligned_to_numpy(py, v, window, drop),
        Buffer::F32(v) => aligned_to_numpy(py, v, window, drop),
    }
}

/// As buffer_to_numpy, but the buffer goes back to `pool` for a later batch.
fn pooled_to_numpy(
    py: Python<'_>,
    buf: Buffer,
    window: usize,
    pool: Arc<BufferPool>,
) -> PyResult<Bound<'_, PyAny>> {
    match buf {
        Buffer::I8(v) => aligned_to_numpy(py, v, window, move |v| pool.give(Buffer::I8(v))),
        Buffer::I16(v) => aligned_to_numpy(py, v, window, move |v| pool.give(Buffer::I16(v))),
        Buffer::F32(v) => aligned_to_numpy(py, v, window, move |v| pool.give(Buffer::F32(v))),
    }
}

/// Gathers `ids` into a caller-owned `out` of element type T (checked), GIL released.
fn gather_into<T: Element + Plain>(
    py: Python<'_>,
    ds: &Dataset,
    ids: &[u64],
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let want = [ids.len(), ds.window_len() as usize, 2];
    let bad = |what: String| -> PyErr {
        Error::config(
            "out",
            format!(
                "must be a C-contiguous, writable numpy {} array of shape {want:?}; {what}",
                ds.storage().name()
            ),
        )
        .into()
    };
    let arr = out
        .cast::<PyArray3<T>>()
        .map_err(|_| bad(format!("got {}", describe(out))))?;
    if arr.shape() != want {
        return Err(bad(format!("got shape {:?}", arr.shape())));
    }
    if !arr.is_c_contiguous() {
        return Err(bad("got a non-contiguous array".into()));
    }
    let mut rw = arr
        .try_readwrite()
        .map_err(|e| bad(format!("cannot write to it ({e})")))?;
    let slice = rw.as_slice_mut().map_err(|e| bad(e.to_string()))?;
    let bytes = bytes_mut(slice);
    py.detach(|| ds.gather(ids, bytes))?;
    Ok(())
}

/// The address of ring buffer `i`: a C-contiguous, aligned, writable `[rows, window, 2]` numpy
/// array of element type T (checked). Its memory stays valid while the caller keeps a reference
/// to the array object (the NativeStream does).
fn ring_buffer<T: Element + Plain>(
    i: usize,
    obj: &Bound<'_, PyAny>,
    want: [usize; 3],
    dtype: &str,
) -> PyResult<RawBuf> {
    let bad = |what: String| -> PyErr {
        Error::config(
            &format!("buffers[{i}]"),
            format!(
                "must be a C-contiguous, aligned, writable numpy {dtype} array of shape \
                 {want:?} (the dataset's storage dtype); {what}"
            ),
        )
        .into()
    };
    let arr = obj
        .cast::<PyArray3<T>>()
        .map_err(|_| bad(format!("got {}", describe(obj))))?;
    if arr.shape() != want {
        return Err(bad(format!("got shape {:?}", arr.shape())));
    }
    if !arr.is_c_contiguous() {
        return Err(bad("got a non-contiguous array".into()));
    }
    if !arr.is_aligned() {
        return Err(bad("got an unaligned array".into()));
    }
    // The borrow checks writability (and that no Rust code borrows it now); it ends here, the
    // ring's own slot states govern writes from now on.
    let mut rw = arr
        .try_readwrite()
        .map_err(|e| bad(format!("cannot write to it ({e})")))?;
    let slice = rw.as_slice_mut().map_err(|e| bad(e.to_string()))?;
    let bytes = bytes_mut(slice);
    Ok(RawBuf::new(bytes.as_mut_ptr(), bytes.len())?)
}

/// The items of a list or tuple (any sequence but a string or bytes), or None.
fn items<'py>(obj: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return None;
    }
    obj.extract().ok()
}

/// `describe`, with the number of items of a sequence.
fn counted(obj: &Bound<'_, PyAny>) -> String {
    match items(obj) {
        Some(v) => format!("{} of {} items", describe(obj), v.len()),
        None => describe(obj),
    }
}

/// One integer of recording `path`'s layout, as u64: anything else (negative, 2^64 or more, not
/// an int) is a DataError naming the file and `field`.
fn layout_uint(path: &str, field: &str, obj: &Bound<'_, PyAny>) -> Result<u64, Error> {
    let bad = |got: String| {
        Error::data(
            path,
            field,
            format!("must be a non-negative integer below 2^64, got {got}"),
        )
    };
    match obj.extract::<i128>() {
        Ok(v) => u64::try_from(v).map_err(|_| bad(v.to_string())),
        Err(_) if obj.is_instance_of::<pyo3::types::PyInt>() => Err(bad(obj
            .str()
            .map_or_else(|_| "an int".into(), |s| s.to_string()))),
        Err(_) => Err(bad(describe(obj))),
    }
}

/// The `layouts` argument: None (every recording plain), or one entry per data path, each None
/// (plain) or `(file_bytes, channels, channel, runs)` with `runs` a list of
/// `(start, samples, byte)`. A malformed list or entry is a ValueError naming it (`layouts`,
/// `layouts[r]`, `layouts[r].runs`, `layouts[r].runs[i]`); a bad integer a DataError naming the
/// recording's file and the field (`file_bytes`, `channels`, `channel`, `segment {i} start`,
/// `segment {i} samples`, `segment {i} byte`).
fn layouts_arg(paths: &[String], obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Option<Layout>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(vec![None; paths.len()]);
    };
    let entries = items(obj).ok_or_else(|| {
        Error::config(
            "layouts",
            format!(
                "must be None or a list with one entry per data path (None or a tuple \
                 (file_bytes, channels, channel, runs)), got {}",
                describe(obj)
            ),
        )
    })?;
    if entries.len() != paths.len() {
        return Err(Error::config(
            "layouts",
            format!(
                "has {} entries but data_paths has {}",
                entries.len(),
                paths.len()
            ),
        )
        .into());
    }
    let mut out = Vec::with_capacity(entries.len());
    for (r, (entry, path)) in entries.iter().zip(paths).enumerate() {
        if entry.is_none() {
            out.push(None);
            continue;
        }
        let fields = items(entry).filter(|f| f.len() == 4).ok_or_else(|| {
            Error::config(
                &format!("layouts[{r}]"),
                format!(
                    "must be None or a tuple (file_bytes, channels, channel, runs), got {}",
                    counted(entry)
                ),
            )
        })?;
        let runs = items(&fields[3]).ok_or_else(|| {
            Error::config(
                &format!("layouts[{r}].runs"),
                format!(
                    "must be a list of (start, samples, byte) tuples, got {}",
                    describe(&fields[3])
                ),
            )
        })?;
        let runs = runs
            .iter()
            .enumerate()
            .map(|(i, run)| {
                let t = items(run).filter(|t| t.len() == 3).ok_or_else(|| {
                    Error::config(
                        &format!("layouts[{r}].runs[{i}]"),
                        format!(
                            "must be a tuple (start, samples, byte), got {}",
                            counted(run)
                        ),
                    )
                })?;
                Ok(Run {
                    start: layout_uint(path, &format!("segment {i} start"), &t[0])?,
                    samples: layout_uint(path, &format!("segment {i} samples"), &t[1])?,
                    byte: layout_uint(path, &format!("segment {i} byte"), &t[2])?,
                })
            })
            .collect::<Result<Vec<Run>, Error>>()?;
        out.push(Some(Layout {
            file_bytes: layout_uint(path, "file_bytes", &fields[0])?,
            channels: layout_uint(path, "channels", &fields[1])?,
            channel: layout_uint(path, "channel", &fields[2])?,
            runs,
        }));
    }
    Ok(out)
}

/// Recordings cut into windows, one run (capture segment) at a time; see docs/design.md
/// "Recordings and windows".
#[pyclass(module = "iqtrain._native", frozen)]
pub struct NativeDataset {
    ds: Arc<Dataset>,
}

#[pymethods]
impl NativeDataset {
    /// `kinds[r]`: recording `r`'s SigMF datatype (one of the 14 complex ones, canonical name).
    /// `layouts`: None (every recording a plain single-channel file of whole samples, one run
    /// covering it) or one entry per data path: None (plain), or
    /// `(file_bytes, channels, channel, runs)`: the file's length (it must have it, else a
    /// DataError "changed length"), its interleaved channels and the one read, and its runs,
    /// each `(start, samples, byte)`: `samples` sample frames from byte `byte` of the file,
    /// windowed on their own (`start`, the run's first sample index, is what window locations
    /// report). `map_min_bytes`: recordings whose runs span at least this many bytes are read
    /// from a guarded memory map of that span (default 256 KiB; 2**64 - 1 maps nothing). `max_open_files`: at most this many data files are open at once (default:
    /// every recording with a window); the rest are opened again, by path, when read.
    /// `select`: base window ids (the numbering without it) the dataset is restricted to, in
    /// order (a 1-D numpy uint64 array or a sequence of ints): window `i` is then base window
    /// `select[i]`. Empty is a ValueError, an id out of range an IndexError.
    #[new]
    // The Python constructor's keyword arguments, one per option.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        data_paths, kinds, window, stride, layouts = None, map_min_bytes = None,
        max_open_files = None, select = None
    ))]
    fn new(
        py: Python<'_>,
        data_paths: Vec<String>,
        kinds: Vec<String>,
        window: i128,
        stride: i128,
        layouts: Option<&Bound<'_, PyAny>>,
        map_min_bytes: Option<i128>,
        max_open_files: Option<i128>,
        select: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let window = positive("window", window)?;
        let stride = positive("stride", stride)?;
        let mut policy = ReadPolicy::default();
        if let Some(v) = map_min_bytes {
            policy.map_min_bytes = uint("map_min_bytes", v)?;
        }
        if let Some(v) = max_open_files {
            let v = positive("max_open_files", v)?;
            policy.max_open_files = usize::try_from(v).unwrap_or(usize::MAX);
        }
        let layouts = layouts_arg(&data_paths, layouts)?;
        let select = select
            .filter(|obj| !obj.is_none())
            .map(select_arg)
            .transpose()?;
        let ds = py.detach(|| {
            let ds = Dataset::open_with(&data_paths, &kinds, &layouts, window, stride, policy)?;
            match select {
                Some(ids) => ds.select(ids),
                None => Ok(ds),
            }
        })?;
        Ok(NativeDataset { ds: Arc::new(ds) })
    }

    #[getter]
    fn num_windows(&self) -> u64 {
        self.ds.num_windows()
    }
    /// Windows without the selection (`num_windows` when there is none).
    #[getter]
    fn base_num_windows(&self) -> u64 {
        self.ds.base_windows()
    }
    /// The selection's base window ids (a new uint64 array), or None.
    #[getter]
    fn selection<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<u64>>> {
        self.ds.selection().map(|t| PyArray1::from_slice(py, t))
    }
    #[getter]
    fn window_len(&self) -> u64 {
        self.ds.window_len()
    }
    #[getter]
    fn stride(&self) -> u64 {
        self.ds.stride()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.ds.storage().name()
    }
    #[getter]
    fn num_recordings(&self) -> usize {
        self.ds.recordings().len()
    }
    /// Recordings whose rows are copied from a sound guarded mapping (the rest use pread).
    #[getter]
    fn mapped_recordings(&self) -> usize {
        self.ds
            .recordings()
            .iter()
            .filter(|r| r.is_mapped())
            .count()
    }
    /// `(open now, at most)`: the data files this dataset holds open, and its cap.
    #[getter]
    fn open_files(&self) -> (usize, usize) {
        self.ds.open_files()
    }
    #[getter]
    fn recording_windows(&self) -> Vec<u64> {
        self.ds.recordings().iter().map(|r| r.windows).collect()
    }
    /// Samples (of the channel read) in each recording's runs.
    #[getter]
    fn recording_samples(&self) -> Vec<u64> {
        self.ds.recordings().iter().map(|r| r.samples).collect()
    }

    /// Window `i` as a fresh `[window_len, 2]` array in the storage dtype.
    fn window<'py>(&self, py: Python<'py>, i: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let id = index_arg(i, "window id", self.ds.num_windows())?;
        let a = self.alloc_gather(py, &[id])?;
        // [1, L, 2] -> [L, 2]
        a.get_item(0)
    }

    /// Fills `out[j] = window(ids[j])` in parallel without the GIL.
    fn gather(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ids = ids_arg(ids)?;
        match self.ds.storage() {
            Storage::Int8 => gather_into::<i8>(py, &self.ds, &ids, out),
            Storage::Int16 => gather_into::<i16>(py, &self.ds, &ids, out),
            Storage::Float32 => gather_into::<f32>(py, &self.ds, &ids, out),
        }
    }

    /// `gather` into a newly allocated `[len(ids), window_len, 2]` array.
    fn windows<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = ids_arg(ids)?;
        self.alloc_gather(py, &ids)
    }

    fn __repr__(&self) -> String {
        let selected = match self.ds.selection() {
            Some(_) => format!(", base_windows={}", self.ds.base_windows()),
            None => String::new(),
        };
        format!(
            "NativeDataset(recordings={}, windows={}{selected}, window_len={}, stride={}, \
             dtype='{}')",
            self.ds.recordings().len(),
            self.ds.num_windows(),
            self.ds.window_len(),
            self.ds.stride(),
            self.ds.storage().name()
        )
    }
}

impl NativeDataset {
    fn alloc_gather<'py>(&self, py: Python<'py>, ids: &[u64]) -> PyResult<Bound<'py, PyAny>> {
        let ds = &self.ds;
        let buf = py.detach(|| -> Result<Buffer, Error> {
            for &id in ids {
                ds.check_id(id)?;
            }
            let elems = ids
                .len()
                .checked_mul(ds.row_elems())
                .ok_or_else(|| Error::config("ids", "too many windows for one array"))?;
            let mut buf = Buffer::zeroed(ds.storage(), elems)?;
            ds.gather(ids, buf.as_bytes_mut())?;
            Ok(buf)
        })?;
        buffer_to_numpy(py, buf, ds.row_elems() / 2)
    }
}

/// `perm(n, seed, epoch)[pos]`: the epoch permutation of the stream, for tests and inspection.
#[pyfunction]
fn feistel_index(n: i128, seed: i128, epoch: i128, pos: i128) -> PyResult<u64> {
    let n = positive("n", n)?;
    let (seed, epoch) = (uint("seed", seed)?, uint("epoch", epoch)?);
    let pos = u64::try_from(pos)
        .ok()
        .filter(|&p| p < n)
        .ok_or_else(|| PyIndexError::new_err(format!("pos {pos} is out of range [0, {n})")))?;
    Ok(crate::feistel_index(n, seed, epoch, pos)?)
}

/// One rank's view of the seeded global sample stream, with background prefetch.
#[pyclass(module = "iqtrain._native", frozen)]
pub struct NativeStream {
    inner: Mutex<Stream>,
    window: usize,
}

impl NativeStream {
    fn lock(&self) -> Result<MutexGuard<'_, Stream>, Error> {
        self.inner
            .lock()
            .map_err(|_| Error::Internal("stream state poisoned by an earlier failure".into()))
    }
}

/// Upper bound on prefetch depth (each slot holds a whole batch).
const MAX_PREFETCH: u64 = 64;

#[pymethods]
impl NativeStream {
    #[new]
    #[pyo3(signature = (dataset, batch_size, seed, rank = 0, world_size = 1, prefetch = 2))]
    fn new(
        dataset: &Bound<'_, NativeDataset>,
        batch_size: i128,
        seed: i128,
        rank: i128,
        world_size: i128,
        prefetch: i128,
    ) -> PyResult<Self> {
        let batch_size = positive("batch_size", batch_size)?;
        let seed = uint("seed", seed)?;
        let rank = uint("rank", rank)?;
        let world_size = positive("world_size", world_size)?;
        let prefetch = uint("prefetch", prefetch)?;
        if prefetch > MAX_PREFETCH {
            return Err(Error::config(
                "prefetch",
                format!("must be <= {MAX_PREFETCH}, got {prefetch}"),
            )
            .into());
        }
        let ds = dataset.get().ds.clone();
        let window = ds.row_elems() / 2;
        let s = Stream::new(ds, batch_size, seed, rank, world_size, prefetch as usize)?;
        Ok(NativeStream {
            inner: Mutex::new(s),
            window,
        })
    }

    /// This rank's `[batch_size // world_size, window_len, 2]` rows of the next global batch.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (buf, pool) = py.detach(|| {
            let mut s = self.lock()?;
            s.next_batch().map(|b| (b, s.pool().clone()))
        })?;
        pooled_to_numpy(py, buf, self.window, pool)
    }

    /// Assemble batches straight into `buffers` from now on (see `ring.rs`): each a C-contiguous,
    /// aligned, writable `[batch_size // world_size, window_len, 2]` array in the storage dtype,
    /// pairwise disjoint, at least `prefetch + 1` of them. The stream keeps a reference to each.
    /// Batches prefetched so far are dropped; the position is unchanged.
    fn use_ring(&self, py: Python<'_>, buffers: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let (rows, storage) = {
            let s = self.lock()?;
            (s.spec().local_rows() as usize, s.dataset().storage())
        };
        let want = [rows, self.window, 2];
        let name = storage.name();
        let raws = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| match storage {
                Storage::Int8 => ring_buffer::<i8>(i, b, want, name),
                Storage::Int16 => ring_buffer::<i16>(i, b, want, name),
                Storage::Float32 => ring_buffer::<f32>(i, b, want, name),
            })
            .collect::<PyResult<Vec<RawBuf>>>()?;
        let keepalive: Vec<Py<PyAny>> = buffers.into_iter().map(Bound::unbind).collect();
        py.detach(|| {
            let mut s = self.lock()?;
            // SAFETY: valid for writes: each RawBuf is exactly the data of a C-contiguous,
            // aligned, writable numpy array (checked by ring_buffer), and `keepalive` holds a
            // reference to every array, so numpy frees none of that memory while the ring lives,
            // and the ring drops `keepalive` only after joining its thread. Exclusive: the Rust
            // borrows of the arrays ended in ring_buffer. The rest is the Python caller's side,
            // the contract documented on TrainStream.use_ring and kept by the training loop:
            // touching a buffer only between next_slot() returning it and release(), and never
            // resizing or freeing its storage behind the array (Tensor.resize_,
            // ndarray.resize(refcheck=False)).
            unsafe { s.use_ring(raws, Box::new(keepalive)) }
        })?;
        Ok(())
    }

    /// The ring slot holding this rank's rows of the next global batch, now held by the caller
    /// until `release(slot)`. Raises ValueError when every slot is held (instead of waiting).
    fn next_slot(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(py.detach(|| self.lock()?.next_slot())?)
    }

    /// Gives ring slot `slot` back for a later batch; it must be held (returned by `next_slot`
    /// and not released since).
    fn release(&self, py: Python<'_>, slot: i128) -> PyResult<()> {
        let slot = usize::try_from(slot)
            .map_err(|_| PyIndexError::new_err(format!("slot {slot} is out of range")))?;
        Ok(py.detach(|| self.lock()?.release(slot))?)
    }

    /// Buffers in the ring (0 without one).
    #[getter]
    fn ring_size(&self) -> PyResult<usize> {
        Ok(self.lock()?.ring_len())
    }

    /// Global window ids of the rows last returned by `next()` (empty before it / after seek).
    fn last_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let ids = self.lock()?.last_ids().to_vec();
        Ok(PyArray1::from_vec(py, ids))
    }

    /// Global samples consumed: the stream position (the cursor).
    #[getter]
    fn samples_consumed(&self) -> PyResult<u64> {
        Ok(self.lock()?.samples_consumed())
    }

    /// `samples_consumed // batch_size`.
    #[getter]
    fn batches_consumed(&self) -> PyResult<u64> {
        Ok(self.lock()?.batches_consumed())
    }

    /// Drops prefetched batches; the next `next()` yields global samples `[s, s + batch_size)`.
    fn seek(&self, py: Python<'_>, samples_consumed: i128) -> PyResult<()> {
        let pos = uint("samples_consumed", samples_consumed)?;
        py.detach(|| self.lock()?.seek(pos))?;
        Ok(())
    }

    fn __repr__(&self) -> PyResult<String> {
        let s = self.lock()?;
        let sp = s.spec();
        Ok(format!(
            "NativeStream(batch_size={}, seed={}, rank={}, world_size={}, samples_consumed={})",
            sp.batch_size,
            sp.seed,
            sp.rank,
            sp.world_size,
            s.samples_consumed()
        ))
    }
}

/// Lowercase hex BLAKE3 of each file's content, in the order given, computed in parallel
/// without the GIL: the whole file, or with `offsets[i]` / `sizes[i]` its region
/// `[offset, offset + size)` hashed as an input of its own (an archive member; defaults: 0 and
/// to the end of the file). `expected_lengths[i]`, when given, is the length `paths[i]` must
/// have (what a dataset opened); any other length, or one that changes while being read, is a
/// DataError naming the file, as is a file that cannot be read. A region outside the file is a
/// ValueError (`region`); a list of another length than `paths` a ValueError naming it.
#[pyfunction]
#[pyo3(signature = (paths, expected_lengths = None, offsets = None, sizes = None))]
fn digest_files(
    py: Python<'_>,
    paths: Vec<String>,
    expected_lengths: Option<Vec<u64>>,
    offsets: Option<Vec<u64>>,
    sizes: Option<Vec<u64>>,
) -> PyResult<Vec<String>> {
    let hashes = py.detach(|| {
        crate::digest_files(
            &paths,
            expected_lengths.as_deref(),
            offsets.as_deref(),
            sizes.as_deref(),
        )
    })?;
    Ok(hashes.iter().map(|h| h.to_hex().to_string()).collect())
}

/// The pieces `(offset, bytes)` a region (or file) of `length` bytes is hashed in when its
/// digest is shared (`piece`: a power of two >= 1024): one piece, the whole region, when it
/// fits. Offsets are within the region.
#[pyfunction]
fn digest_plan(length: u64, piece: u64) -> PyResult<Vec<(u64, u64)>> {
    Ok(crate::pieces(length, piece)?)
}

/// One 32-byte value per piece, in parallel without the GIL: piece `i` is bytes
/// `[offsets[i], offsets[i] + sizes[i])` of the region `[bases[i], bases[i] + regions[i])` of
/// `paths[i]`, a file of `lengths[i]` bytes (defaults: base 0, region the whole file). The value
/// is the region's BLAKE3 when the piece is the whole region, else the piece's chaining value
/// (for `digest_merge`, with the region's length). The error of the first failing piece, in the
/// order given.
#[pyfunction]
#[pyo3(signature = (paths, lengths, offsets, sizes, bases = None, regions = None))]
#[allow(clippy::too_many_arguments)]
fn digest_pieces<'py>(
    py: Python<'py>,
    paths: Vec<String>,
    lengths: Vec<u64>,
    offsets: Vec<u64>,
    sizes: Vec<u64>,
    bases: Option<Vec<u64>>,
    regions: Option<Vec<u64>>,
) -> PyResult<Vec<Bound<'py, pyo3::types::PyBytes>>> {
    let n = paths.len();
    for (key, len) in [
        ("lengths", Some(lengths.len())),
        ("offsets", Some(offsets.len())),
        ("sizes", Some(sizes.len())),
        ("bases", bases.as_ref().map(Vec::len)),
        ("regions", regions.as_ref().map(Vec::len)),
    ] {
        if let Some(len) = len.filter(|&l| l != n) {
            return Err(Error::config(key, format!("has {len} entries but paths has {n}")).into());
        }
    }
    let pieces: Vec<Piece<String>> = paths
        .into_iter()
        .enumerate()
        .map(|(i, path)| Piece {
            path,
            len: lengths[i],
            base: bases.as_ref().map_or(0, |b| b[i]),
            region: regions.as_ref().map_or(lengths[i], |r| r[i]),
            offset: offsets[i],
            size: sizes[i],
        })
        .collect();
    let values = py.detach(|| crate::digest_pieces(&pieces))?;
    Ok(values
        .iter()
        .map(|v| pyo3::types::PyBytes::new(py, v))
        .collect())
}

/// Lowercase hex BLAKE3 of a region (or file) of `length` bytes from its pieces' values
/// (`digest_plan` order).
#[pyfunction]
fn digest_merge(length: u64, values: Vec<Vec<u8>>, piece: u64) -> PyResult<String> {
    let mut cvs = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let cv: [u8; 32] = v.as_slice().try_into().map_err(|_| {
            Error::config(
                "values",
                format!("entry {i} has {} bytes, expected 32", v.len()),
            )
        })?;
        cvs.push(cv);
    }
    Ok(crate::merge_pieces(length, piece, &cvs)?
        .to_hex()
        .to_string())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeDataset>()?;
    m.add_class::<NativeStream>()?;
    m.add_function(wrap_pyfunction!(feistel_index, m)?)?;
    m.add_function(wrap_pyfunction!(digest_files, m)?)?;
    m.add_function(wrap_pyfunction!(digest_plan, m)?)?;
    m.add_function(wrap_pyfunction!(digest_pieces, m)?)?;
    m.add_function(wrap_pyfunction!(digest_merge, m)?)?;
    Ok(())
}
