/* netcl.runtime.native's C part: the call of a ``PreparedLaunch`` in one C function, and the caching allocator's hot
 * path with the token that returns a block.
 *
 * ``Launcher(...)`` (made by ``netcl.runtime.launch.PreparedLaunch``, never by users) sets a prepared kernel's
 * per-call arguments and enqueues it without an event: what the generated Python call does through pyopencl's
 * multi-argument setters and ``enqueue.enqueuer``, without the interpreter's frames, pyopencl's argument tuples and
 * the event pyopencl makes and drops. The OpenCL entry points come in as addresses of the loader pyopencl loaded, so
 * the handles are pyopencl's own and no OpenCL header or library is needed to build this file.
 *
 * Contract of a call ``launcher(*args)`` (``len(args)`` per-call arguments, in ``PreparedLaunch``'s order):
 * - while a capture records or a profiler is active (``recording`` or ``profilers`` not empty), ``slow(args)``;
 * - a buffer argument that is a pyopencl memory object is set from its handle (a pool block's handle read from its
 *   ``Token``, below, else ``int_ptr``), None as a null buffer; any other object is set by pyopencl's
 *   ``_set_arg_multi``; a scalar that is a Python float (pack code f or d) or an int in its type's range (i, I, l,
 *   L) is packed here as pyopencl's ``_set_arg_buf_pack`` packs it, any other scalar by pyopencl itself (its
 *   conversions and errors);
 * - the launch's lock is held from the first argument set to the enqueue (the slow path takes it too);
 * - a refused argument raises ``error("cannot set arguments of kernel '<name>': ...")`` and a refused enqueue
 *   ``error("clEnqueueNDRangeKernel of kernel '<name>' failed with OpenCL status <s>")``; the lock is free after both.
 *
 * ``Token((free, events, block, event))`` is ``netcl.runtime.memory.BlockToken`` in C: riding on a pooled buffer
 * wrapper (as its ``_netcl_block``), it appends ``block`` to the list ``free`` and ``-event`` to ``events`` when the
 * wrapper dies, in its deallocation instead of a Python ``__del__``.
 *
 * ``Allocator(pool, free, shared_classes, classes, events, from_int_ptr, fallback)`` is ``DevicePool.allocate``'s hot
 * path: for a size whose class is memoized (``shared_classes`` / ``classes``: nbytes -> event base) and whose free
 * list (``free[base]``) holds a block, it pops the block, appends the event ``base + nbytes``, wraps the block's handle
 * (``from_int_ptr(handle, retain=True)``), tags the wrapper with a ``Token`` and folds the pool's events
 * (``pool._fold()``) past ``pool._FOLD_EVERY``; every other call goes to ``fallback`` (the Python method).
 *
 * ``Maker(cls, given, constants)`` makes instances of a class of ``__slots__`` without calling its ``__init__``:
 * ``maker(*values)`` is ``object.__new__(cls)`` with each slot named in ``given`` set to its value and each slot of
 * ``constants`` (a dict) to its constant (every named field must be a writable slot; ``cls`` has no ``__new__``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

typedef int32_t (*set_arg_fn)(void *kernel, uint32_t index, size_t size, const void *value);
typedef int32_t (*enqueue_fn)(void *queue, void *kernel, uint32_t dims, const size_t *offset, const size_t *global,
                              const size_t *local, uint32_t waits, const void *wait_list, void *event);

#define MAX_DIMS 3

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void *kernel, *queue;
    set_arg_fn set_arg;
    enqueue_fn enqueue;
    uint32_t dims;
    size_t global[MAX_DIMS], local[MAX_DIMS];
    int has_local;
    Py_ssize_t count;      /* per-call arguments */
    PyObject *indices;     /* tuple of int: each per-call argument's kernel index */
    PyObject *codes;       /* tuple: each per-call argument's pyopencl pack code (bytes), None for a buffer */
    PyObject *keep;        /* the objects that own the handles (kernel, queue) */
    PyObject *recording, *profilers, *slow, *acquire, *release;
    PyObject *memory_type, *set_buffers, *set_scalars, *error, *name;
} Launcher;

static PyObject *block_attr, *int_ptr_attr, *append_attr, *fold_attr, *fold_every_attr, *retain_names;

typedef struct {
    PyObject_HEAD
    PyObject *free, *events, *block, *event;
} Token;

static PyTypeObject TokenType;

/* A pool block's handle: ``block`` is ``(real buffer, its int_ptr)``. */
static PyObject *block_handle(PyObject *block) {
    return (PyTuple_CheckExact(block) && PyTuple_GET_SIZE(block) == 2 && PyLong_CheckExact(PyTuple_GET_ITEM(block, 1)))
               ? PyTuple_GET_ITEM(block, 1)
               : NULL;
}

/* The cl_mem handle of pyopencl memory object ``value`` into ``*mem``; -1 with an exception set on failure. */
static int handle_of(PyObject *value, void **mem) {
    PyObject *dict = PyObject_GenericGetDict(value, NULL);
    if (dict != NULL) {
        PyObject *token = PyDict_GetItemWithError(dict, block_attr); /* borrowed */
        PyObject *handle = (token != NULL && Py_IS_TYPE(token, &TokenType)) ? block_handle(((Token *)token)->block) : NULL;
        if (handle != NULL) {
            *mem = PyLong_AsVoidPtr(handle);
            Py_DECREF(dict);
            return (*mem == NULL && PyErr_Occurred()) ? -1 : 0;
        }
        Py_DECREF(dict);
        if (PyErr_Occurred()) return -1;
    } else {
        PyErr_Clear(); /* a memory object without a __dict__: read its handle */
    }
    PyObject *pointer = PyObject_GetAttr(value, int_ptr_attr);
    if (pointer == NULL) return -1;
    *mem = PyLong_AsVoidPtr(pointer);
    Py_DECREF(pointer);
    return (*mem == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* Raise ``error("cannot set arguments of kernel '<name>': <the pending exception>")`` chained to it. */
static void raise_bad_args(Launcher *self) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
    PyObject *text = PyUnicode_FromFormat("cannot set arguments of kernel %R: %S", self->name, value ? value : Py_None);
    if (text != NULL) {
        PyObject *exc = PyObject_CallOneArg(self->error, text);
        Py_DECREF(text);
        if (exc != NULL) {
            if (value != NULL) {
                Py_INCREF(value);
                PyException_SetCause(exc, value);
                Py_INCREF(value);
                PyException_SetContext(exc, value);
            }
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
}

/* Set argument ``index`` (a Python int) to the ``size`` bytes at ``value``; 0, or -1 with ValueError set naming the
 * OpenCL status. */
static int set_bytes(Launcher *self, PyObject *index, size_t size, const void *value) {
    int32_t status = self->set_arg(self->kernel, (uint32_t)PyLong_AsUnsignedLong(index), size, value);
    if (status != 0) {
        PyErr_Format(PyExc_ValueError, "clSetKernelArg of argument %S failed with OpenCL status %d", index, (int)status);
        return -1;
    }
    return 0;
}

/* Set scalar argument ``value`` when it is a plain Python number pyopencl would pack the same way: a float for pack
 * code f or d (``(float)`` / ``(double)`` of its value, as pyopencl's converting cast does) or an int within range
 * for i, I, l or L. 1 when set, 0 to leave it to pyopencl (any other value, and every error message, stay its own),
 * -1 with the exception set when the OpenCL call refused it. */
static int set_plain_scalar(Launcher *self, PyObject *index, PyObject *code, PyObject *value) {
    if (!PyBytes_CheckExact(code) || PyBytes_GET_SIZE(code) != 1) return 0;
    char kind = PyBytes_AS_STRING(code)[0];
    union { float f; double d; int i; unsigned int u; long l; unsigned long ul; } packed;
    size_t size;
    if (PyFloat_CheckExact(value) && (kind == 'f' || kind == 'd')) {
        double number = PyFloat_AS_DOUBLE(value);
        if (kind == 'f') {
            packed.f = (float)number;
            size = sizeof(float);
        } else {
            packed.d = number;
            size = sizeof(double);
        }
    } else if (PyLong_CheckExact(value) && (kind == 'i' || kind == 'I' || kind == 'l' || kind == 'L')) {
        int overflow = 0;
        long number = PyLong_AsLongAndOverflow(value, &overflow);
        if (number == -1 && PyErr_Occurred()) return -1;
        if (overflow != 0) return 0; /* out of a long's range (an unsigned long above it included): pyopencl's */
        if (kind == 'i' && number >= INT_MIN && number <= INT_MAX) {
            packed.i = (int)number;
            size = sizeof(int);
        } else if (kind == 'I' && number >= 0 && (unsigned long)number <= UINT_MAX) {
            packed.u = (unsigned int)number;
            size = sizeof(unsigned int);
        } else if (kind == 'l') {
            packed.l = number;
            size = sizeof(long);
        } else if (kind == 'L' && number >= 0) {
            packed.ul = (unsigned long)number;
            size = sizeof(unsigned long);
        } else {
            return 0;
        }
    } else {
        return 0;
    }
    return set_bytes(self, index, size, &packed) < 0 ? -1 : 1;
}

/* Set the per-call arguments; 0, or -1 with the exception set (the caller holds the lock). */
static int set_arguments(Launcher *self, PyObject *const *args) {
    PyObject *others = NULL, *scalars = NULL; /* the arguments pyopencl sets (its multi-argument setters) */
    for (Py_ssize_t i = 0; i < self->count; i++) {
        PyObject *value = args[i];
        PyObject *index = PyTuple_GET_ITEM(self->indices, i);
        PyObject *code = PyTuple_GET_ITEM(self->codes, i);
        if (code == Py_None && (value == Py_None || PyObject_TypeCheck(value, (PyTypeObject *)self->memory_type))) {
            void *mem = NULL;
            if ((value != Py_None && handle_of(value, &mem) < 0) || set_bytes(self, index, sizeof(void *), &mem) < 0)
                goto failed;
            continue;
        }
        if (code != Py_None) {
            int packed = set_plain_scalar(self, index, code, value);
            if (packed < 0) goto failed;
            if (packed) continue;
        }
        PyObject **list = code == Py_None ? &others : &scalars; /* flat: index, [code,] value, ... */
        if ((*list == NULL && (*list = PyList_New(0)) == NULL) || PyList_Append(*list, index) < 0 ||
            (code != Py_None && PyList_Append(*list, code) < 0) || PyList_Append(*list, value) < 0)
            goto failed;
    }
    if (others != NULL) {
        PyObject *items = PyList_AsTuple(others), *done = items ? PyObject_CallOneArg(self->set_buffers, items) : NULL;
        Py_XDECREF(items);
        if (done == NULL) goto failed;
        Py_DECREF(done);
    }
    if (scalars != NULL) {
        PyObject *items = PyList_AsTuple(scalars), *done = items ? PyObject_CallOneArg(self->set_scalars, items) : NULL;
        Py_XDECREF(items);
        if (done == NULL) goto failed;
        Py_DECREF(done);
    }
    Py_XDECREF(others);
    Py_XDECREF(scalars);
    return 0;
failed:
    Py_XDECREF(others);
    Py_XDECREF(scalars);
    raise_bad_args(self);
    return -1;
}

static PyObject *launcher_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Launcher *self = (Launcher *)op;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_Format(PyExc_TypeError, "the prepared launch of kernel %R takes positional arguments only", self->name);
        return NULL;
    }
    if (PyDict_GET_SIZE(self->recording) != 0 || PyList_GET_SIZE(self->profilers) != 0) {
        PyObject *every = PyTuple_New(n);
        if (every == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(every, i, args[i]);
        }
        PyObject *done = PyObject_CallOneArg(self->slow, every);
        Py_DECREF(every);
        return done;
    }
    if (n != self->count) {
        PyErr_Format(PyExc_TypeError, "the prepared launch of kernel %R takes %zd per-call arguments, got %zd",
                     self->name, self->count, n);
        return NULL;
    }
    PyObject *locked = PyObject_CallNoArgs(self->acquire);
    if (locked == NULL) return NULL;
    Py_DECREF(locked);
    int32_t status = 0;
    int failed = set_arguments(self, args) < 0;
    if (!failed) {
        status = self->enqueue(self->queue, self->kernel, self->dims, NULL, self->global,
                               self->has_local ? self->local : NULL, 0, NULL, NULL);
    }
    PyObject *saved_type = NULL, *saved_value = NULL, *saved_traceback = NULL;
    if (failed) PyErr_Fetch(&saved_type, &saved_value, &saved_traceback);
    PyObject *unlocked = PyObject_CallNoArgs(self->release);
    if (failed) {
        Py_XDECREF(unlocked);
        PyErr_Restore(saved_type, saved_value, saved_traceback);
        return NULL;
    }
    if (unlocked == NULL) return NULL;
    Py_DECREF(unlocked);
    if (status != 0) {
        PyObject *text = PyUnicode_FromFormat("clEnqueueNDRangeKernel of kernel %R failed with OpenCL status %d",
                                              self->name, (int)status);
        if (text != NULL) {
            PyErr_SetObject(self->error, text);
            Py_DECREF(text);
        }
        return NULL;
    }
    Py_RETURN_NONE;
}

static int read_sizes(PyObject *sizes, size_t *out, uint32_t *dims, const char *what) {
    PyObject *seq = PySequence_Fast(sizes, what);
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > MAX_DIMS || (*dims != 0 && (uint32_t)n != *dims)) {
        PyErr_Format(PyExc_ValueError, "%s: 1 to %d sizes (as many as the global size), got %zd", what, MAX_DIMS, n);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (out[i] == (size_t)-1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    *dims = (uint32_t)n;
    Py_DECREF(seq);
    return 0;
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long kernel, queue, set_arg, enqueue;
    PyObject *global, *local, *indices, *codes, *keep, *recording, *profilers, *slow, *acquire, *release;
    PyObject *memory_type, *set_buffers, *set_scalars, *error, *name;
    static char *names[] = {"kernel", "queue", "set_arg", "enqueue", "global_size", "local_size", "indices", "codes",
                            "keep", "recording", "profilers", "slow", "acquire", "release", "memory_type",
                            "set_buffers", "set_scalars", "error", "name", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKKOOO!O!OO!O!OOOO!OOOU:Launcher", names, &kernel, &queue,
                                     &set_arg, &enqueue, &global, &local, &PyTuple_Type, &indices, &PyTuple_Type,
                                     &codes, &keep, &PyDict_Type, &recording, &PyList_Type, &profilers, &slow,
                                     &acquire, &release, &PyType_Type, &memory_type, &set_buffers, &set_scalars,
                                     &error, &name))
        return NULL;
    if (PyTuple_GET_SIZE(indices) != PyTuple_GET_SIZE(codes)) {
        PyErr_SetString(PyExc_ValueError, "Launcher: one pack code per argument index");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(indices); i++) {
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(indices, i))) {
            PyErr_SetString(PyExc_TypeError, "Launcher: argument indices must be ints");
            return NULL;
        }
    }
    Launcher *self = (Launcher *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = launcher_call;
    self->kernel = (void *)(uintptr_t)kernel;
    self->queue = (void *)(uintptr_t)queue;
    self->set_arg = (set_arg_fn)(uintptr_t)set_arg;
    self->enqueue = (enqueue_fn)(uintptr_t)enqueue;
    self->count = PyTuple_GET_SIZE(indices);
    PyObject **fields[] = {&self->indices, &self->codes, &self->keep, &self->recording, &self->profilers, &self->slow,
                           &self->acquire, &self->release, &self->memory_type, &self->set_buffers,
                           &self->set_scalars, &self->error, &self->name};
    PyObject *values[] = {indices, codes, keep, recording, profilers, slow, acquire, release, memory_type,
                          set_buffers, set_scalars, error, name};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    if (read_sizes(global, self->global, &self->dims, "Launcher global_size") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->has_local = local != Py_None;
    if (self->has_local && read_sizes(local, self->local, &self->dims, "Launcher local_size") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->indices); Py_VISIT(self->codes); Py_VISIT(self->keep); Py_VISIT(self->recording);
    Py_VISIT(self->profilers); Py_VISIT(self->slow); Py_VISIT(self->acquire); Py_VISIT(self->release);
    Py_VISIT(self->memory_type); Py_VISIT(self->set_buffers);
    Py_VISIT(self->set_scalars); Py_VISIT(self->error); Py_VISIT(self->name);
    return 0;
}

static int launcher_clear(Launcher *self) {
    Py_CLEAR(self->indices); Py_CLEAR(self->codes); Py_CLEAR(self->keep); Py_CLEAR(self->recording);
    Py_CLEAR(self->profilers); Py_CLEAR(self->slow); Py_CLEAR(self->acquire); Py_CLEAR(self->release);
    Py_CLEAR(self->memory_type); Py_CLEAR(self->set_buffers);
    Py_CLEAR(self->set_scalars); Py_CLEAR(self->error); Py_CLEAR(self->name);
    return 0;
}

static void launcher_dealloc(Launcher *self) {
    PyObject_GC_UnTrack(self);
    launcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netcl.runtime.native._launcher.Launcher",
    .tp_doc = "A prepared kernel launch: launcher(*per_call_arguments) sets them and enqueues (see launcher.c).",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = launcher_new,
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_dealloc = (destructor)launcher_dealloc,
};

/* ---- Token: a pooled wrapper's block, returned when the wrapper dies ---- */

static Token *token_make(PyObject *free, PyObject *events, PyObject *block, PyObject *event) {
    Token *self = PyObject_New(Token, &TokenType);
    if (self == NULL) return NULL;
    Py_INCREF(free); self->free = free;
    Py_INCREF(events); self->events = events;
    Py_INCREF(block); self->block = block;
    Py_INCREF(event); self->event = event;
    return self;
}

static PyObject *token_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *fields;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "Token takes one tuple (free, events, block, event)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!:Token", &PyTuple_Type, &fields)) return NULL;
    if (PyTuple_GET_SIZE(fields) != 4 || !PyList_Check(PyTuple_GET_ITEM(fields, 0))) {
        PyErr_SetString(PyExc_TypeError, "Token takes one tuple (free list, events, block, event)");
        return NULL;
    }
    (void)type;
    return (PyObject *)token_make(PyTuple_GET_ITEM(fields, 0), PyTuple_GET_ITEM(fields, 1), PyTuple_GET_ITEM(fields, 2),
                                  PyTuple_GET_ITEM(fields, 3));
}

/* Put ``block`` back on its free list ``free`` and, where its taking was logged, log its return (``-event`` on
 * ``events``): what ``BlockToken.__del__`` does. A pending exception survives; a failure here (at interpreter
 * shutdown, when there is nothing to return to) is dropped. */
static void return_block(PyObject *free, PyObject *events, PyObject *block, PyObject *event, int logged) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (PyList_Append(free, block) == 0 && logged) {
        PyObject *opposite = PyNumber_Negative(event);
        PyObject *done = opposite != NULL ? PyObject_CallMethodOneArg(events, append_attr, opposite) : NULL;
        Py_XDECREF(opposite);
        Py_XDECREF(done);
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

static void token_dealloc(Token *self) {
    return_block(self->free, self->events, self->block, self->event, 1);
    Py_DECREF(self->free);
    Py_DECREF(self->events);
    Py_DECREF(self->block);
    Py_DECREF(self->event);
    PyObject_Free(self);
}

static PyObject *token_real(Token *self, void *closure) {
    (void)closure;
    PyObject *real = PyTuple_Check(self->block) && PyTuple_GET_SIZE(self->block) > 0 ? PyTuple_GET_ITEM(self->block, 0) : NULL;
    if (real == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the token's block holds no buffer");
        return NULL;
    }
    Py_INCREF(real);
    return real;
}

static PyObject *token_block(Token *self, void *closure) {
    (void)closure;
    Py_INCREF(self->block);
    return self->block;
}

static PyGetSetDef token_fields[] = {
    {"real", (getter)token_real, NULL, "The pool's own cl.Buffer of the block.", NULL},
    {"block", (getter)token_block, NULL, "(the pool's cl.Buffer, its int_ptr).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TokenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netcl.runtime.native._launcher.Token",
    .tp_doc = "A pooled buffer's block, returned to its free list when the buffer dies (see launcher.c).",
    .tp_basicsize = sizeof(Token),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = token_new,
    .tp_dealloc = (destructor)token_dealloc,
    .tp_getset = token_fields,
};

/* ---- Allocator: DevicePool.allocate's hot path ---- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *pool, *free, *shared_classes, *classes, *events, *from_int_ptr, *fallback;
} Allocator;

/* The event base of ``nbytes`` if memoized (borrowed), else NULL (an error set only if the lookup failed). */
static PyObject *memoized_base(Allocator *self, PyObject *nbytes) {
    PyObject *base = PyDict_GetItemWithError(self->shared_classes, nbytes);
    if (base == NULL && !PyErr_Occurred()) base = PyDict_GetItemWithError(self->classes, nbytes);
    return base;
}

/* Fold the pool's events when more than ``pool._FOLD_EVERY`` are queued; -1 with an exception set on failure. */
static int fold_if_due(Allocator *self) {
    PyObject *every = PyObject_GetAttr(self->pool, fold_every_attr);
    if (every == NULL) return -1;
    Py_ssize_t limit = PyLong_AsSsize_t(every);
    Py_DECREF(every);
    Py_ssize_t queued = PyObject_Size(self->events);
    if ((limit == -1 || queued == -1) && PyErr_Occurred()) return -1;
    if (queued <= limit) return 0;
    PyObject *done = PyObject_CallMethodNoArgs(self->pool, fold_attr);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

static PyObject *allocator_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Allocator *self = (Allocator *)op;
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL || !PyLong_CheckExact(args[1]))
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    PyObject *nbytes = args[1];
    PyObject *base = memoized_base(self, nbytes);
    PyObject *blocks = base != NULL ? PyDict_GetItemWithError(self->free, base) : NULL;
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t count = blocks != NULL && PyList_CheckExact(blocks) ? PyList_GET_SIZE(blocks) : 0;
    if (count == 0) return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames); /* a fresh block */
    PyObject *block = PyList_GET_ITEM(blocks, count - 1);
    Py_INCREF(block);
    if (PyList_SetSlice(blocks, count - 1, count, NULL) < 0) {
        Py_DECREF(block);
        return NULL;
    }
    PyObject *wrapper = NULL, *event = PyNumber_Add(base, nbytes), *handle = block_handle(block);
    int logged = 0;
    if (event != NULL && handle != NULL) {
        PyObject *done = PyObject_CallMethodOneArg(self->events, append_attr, event);
        logged = done != NULL;
        Py_XDECREF(done);
    } else if (event != NULL) {
        PyErr_SetString(PyExc_TypeError, "a pool block is (buffer, int_ptr)");
    }
    if (logged) {
        PyObject *call[] = {handle, Py_True};
        wrapper = PyObject_Vectorcall(self->from_int_ptr, call, 1, retain_names);
    }
    if (wrapper != NULL) {
        Token *token = token_make(blocks, self->events, block, event);
        if (token == NULL) {
            Py_CLEAR(wrapper);
        } else {
            int attached = PyObject_SetAttr(wrapper, block_attr, (PyObject *)token) == 0;
            Py_DECREF(token); /* not attached: it dies here, returning the block and cancelling its event */
            if (!attached) {
                Py_DECREF(wrapper);
                Py_DECREF(block);
                Py_DECREF(event);
                return NULL;
            }
        }
    }
    if (wrapper == NULL) return_block(blocks, self->events, block, event, logged); /* undo: back, event cancelled */
    Py_DECREF(block);
    Py_XDECREF(event);
    if (wrapper != NULL && fold_if_due(self) < 0) Py_CLEAR(wrapper);
    return wrapper;
}

static PyObject *allocator_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *pool, *free, *shared_classes, *classes, *events, *from_int_ptr, *fallback;
    static char *names[] = {"pool", "free", "shared_classes", "classes", "events", "from_int_ptr", "fallback", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!O!OOO:Allocator", names, &pool, &PyDict_Type, &free,
                                     &PyDict_Type, &shared_classes, &PyDict_Type, &classes, &events, &from_int_ptr,
                                     &fallback))
        return NULL;
    Allocator *self = (Allocator *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = allocator_call;
    PyObject **fields[] = {&self->pool, &self->free, &self->shared_classes, &self->classes, &self->events,
                           &self->from_int_ptr, &self->fallback};
    PyObject *values[] = {pool, free, shared_classes, classes, events, from_int_ptr, fallback};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    return (PyObject *)self;
}

static int allocator_traverse(Allocator *self, visitproc visit, void *arg) {
    Py_VISIT(self->pool); Py_VISIT(self->free); Py_VISIT(self->shared_classes); Py_VISIT(self->classes);
    Py_VISIT(self->events); Py_VISIT(self->from_int_ptr); Py_VISIT(self->fallback);
    return 0;
}

static int allocator_clear(Allocator *self) {
    Py_CLEAR(self->pool); Py_CLEAR(self->free); Py_CLEAR(self->shared_classes); Py_CLEAR(self->classes);
    Py_CLEAR(self->events); Py_CLEAR(self->from_int_ptr); Py_CLEAR(self->fallback);
    return 0;
}

static void allocator_dealloc(Allocator *self) {
    PyObject_GC_UnTrack(self);
    allocator_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef allocator_members[] = {
    {"__self__", T_OBJECT, offsetof(Allocator, pool), READONLY, "The pool this is the allocate of."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AllocatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netcl.runtime.native._launcher.Allocator",
    .tp_doc = "DevicePool.allocate's hot path: allocator(device, nbytes) -> a pooled cl.Buffer (see launcher.c).",
    .tp_basicsize = sizeof(Allocator),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Allocator, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = allocator_new,
    .tp_traverse = (traverseproc)allocator_traverse,
    .tp_clear = (inquiry)allocator_clear,
    .tp_dealloc = (destructor)allocator_dealloc,
    .tp_members = allocator_members,
};

/* ---- Maker: a new instance of a class of __slots__ with its fields set ---- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *constants;   /* tuple: the values of the fields after the given ones */
    Py_ssize_t given;      /* fields given per call */
    Py_ssize_t count;      /* fields: given, then constant */
    Py_ssize_t *offsets;   /* each field's slot offset in an instance */
} Maker;

/* The offset of ``cls``'s writable object slot ``name`` (a ``__slots__`` member), or -1 with TypeError set. */
static Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name) {
    PyObject *descr = PyUnicode_Check(name) ? _PyType_Lookup(cls, name) : NULL; /* borrowed */
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) return member->offset;
    }
    PyErr_Format(PyExc_TypeError, "Maker: %R is not a writable __slots__ field of %s", name, cls->tp_name);
    return -1;
}

static PyObject *maker_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Maker *self = (Maker *)op;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n != self->given || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_Format(PyExc_TypeError, "the maker of %s takes %zd positional arguments, got %zd", self->cls->tp_name,
                     self->given, n);
        return NULL;
    }
    PyObject *made = self->cls->tp_alloc(self->cls, 0); /* every slot NULL */
    if (made == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->count; i++) {
        PyObject *value = i < n ? args[i] : PyTuple_GET_ITEM(self->constants, i - n);
        *(PyObject **)((char *)made + self->offsets[i]) = Py_NewRef(value);
    }
    return made;
}

static PyObject *maker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyTypeObject *cls;
    PyObject *given, *constants;
    static char *kw[] = {"cls", "given", "constants", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!:Maker", kw, &PyType_Type, &cls, &PyTuple_Type, &given,
                                     &PyDict_Type, &constants))
        return NULL;
    if (cls->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_Format(PyExc_TypeError, "Maker: %s has a __new__ of its own", cls->tp_name);
        return NULL;
    }
    PyObject *keys = PyDict_Keys(constants), *values = PyDict_Values(constants);
    PyObject *key_tuple = keys != NULL ? PyList_AsTuple(keys) : NULL;
    PyObject *constant_values = values != NULL ? PyList_AsTuple(values) : NULL;
    PyObject *names = key_tuple != NULL ? PySequence_Concat(given, key_tuple) : NULL;
    Maker *self = NULL;
    if (names != NULL && constant_values != NULL && (self = (Maker *)type->tp_alloc(type, 0)) != NULL) {
        self->vectorcall = maker_call;
        self->cls = (PyTypeObject *)Py_NewRef(cls);
        self->constants = Py_NewRef(constant_values);
        self->given = PyTuple_GET_SIZE(given);
        self->count = PyTuple_GET_SIZE(names);
        self->offsets = PyMem_New(Py_ssize_t, self->count > 0 ? self->count : 1);
        if (self->offsets == NULL) PyErr_NoMemory();
        for (Py_ssize_t i = 0; self->offsets != NULL && i < self->count; i++) {
            if ((self->offsets[i] = slot_offset(cls, PyTuple_GET_ITEM(names, i))) < 0) break;
        }
        if (PyErr_Occurred()) Py_CLEAR(self);
    }
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(key_tuple);
    Py_XDECREF(constant_values);
    Py_XDECREF(names);
    return (PyObject *)self;
}

static int maker_traverse(Maker *self, visitproc visit, void *arg) {
    Py_VISIT(self->cls); Py_VISIT(self->constants);
    return 0;
}

static int maker_clear(Maker *self) {
    Py_CLEAR(self->cls); Py_CLEAR(self->constants);
    return 0;
}

static void maker_dealloc(Maker *self) {
    PyObject_GC_UnTrack(self);
    maker_clear(self);
    PyMem_Free(self->offsets);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netcl.runtime.native._launcher.Maker",
    .tp_doc = "maker(*given) -> a new instance of a class of __slots__ with its fields set (see launcher.c).",
    .tp_basicsize = sizeof(Maker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = maker_new,
    .tp_traverse = (traverseproc)maker_traverse,
    .tp_clear = (inquiry)maker_clear,
    .tp_dealloc = (destructor)maker_dealloc,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_launcher",
    .m_doc = "netcl's compiled launch (launcher.c).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__launcher(void) {
    block_attr = PyUnicode_InternFromString("_netcl_block");
    int_ptr_attr = PyUnicode_InternFromString("int_ptr");
    append_attr = PyUnicode_InternFromString("append");
    fold_attr = PyUnicode_InternFromString("_fold");
    fold_every_attr = PyUnicode_InternFromString("_FOLD_EVERY");
    retain_names = Py_BuildValue("(s)", "retain");
    if (block_attr == NULL || int_ptr_attr == NULL || append_attr == NULL || fold_attr == NULL ||
        fold_every_attr == NULL || retain_names == NULL)
        return NULL;
    PyTypeObject *types[] = {&LauncherType, &TokenType, &AllocatorType, &MakerType};
    const char *type_names[] = {"Launcher", "Token", "Allocator", "Maker"};
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0 || PyModule_AddObjectRef(m, type_names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
