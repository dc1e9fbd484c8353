/*
 * zerod.h — the public C ABI of libzerod, version 1.
 *
 * A trainer in any language links libzerod and drives its model state through
 * these calls; it keeps doing its own math. The same calls work in embedded
 * mode (the engine runs inside the trainer process) and against a node
 * daemon that serves several ranks.
 *
 * Rules this header keeps, so that it can be a stable promise:
 *  - Handles are opaque (incomplete structs); create/destroy come in pairs and
 *    destroying NULL does nothing.
 *  - Every call that can fail returns a zd_status. Values only ever grow.
 *    zd_last_error() (per thread) and zd_model_last_error() (per model) say
 *    what was wrong and name the culprit: the parameter, the module, the file
 *    and line of the Lua job script.
 *  - Every struct passed in or out begins with its own size (`struct_size`):
 *    the library reads or writes only min(struct_size, its own size) bytes
 *    and uses defaults for fields the caller does not know. The *_INIT macros
 *    fill it, but nothing needs a macro: set struct_size = sizeof(the struct).
 *    A struct_size below the library's must end on a field boundary (as an
 *    older, shorter struct does); one that ends inside a field is
 *    ZD_ERR_INVALID_ARGUMENT, naming the sizes taken.
 *  - Only plain C types and fixed-width integers; enums are passed as int32_t.
 *  - Exported signatures never change; a changed call gets a _v2 name.
 *
 * Thread safety is stated per group of calls below. In short: a zd_client and
 * the zd_models created on it must be used from one thread at a time (the
 * caller serialises); different clients may be used concurrently.
 */
#ifndef ZEROD_ZEROD_H
#define ZEROD_ZEROD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ZD_BUILDING_LIBRARY)
#define ZD_API __attribute__((visibility("default")))
#else
#define ZD_API
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                  */
/* ------------------------------------------------------------------------ */

/* The ABI this header describes. A library refuses a caller whose major is
 * newer than its own (zd_connect returns ZD_ERR_VERSION). Minor versions only
 * add calls and struct fields. */
#define ZD_ABI_VERSION_MAJOR 1
#define ZD_ABI_VERSION_MINOR 7
#define ZD_ABI_VERSION ((ZD_ABI_VERSION_MAJOR << 16) | ZD_ABI_VERSION_MINOR)

/* The library's ABI version, (major << 16) | minor. Thread-safe. */
ZD_API uint32_t zd_abi_version(void);
/* The library's release version, e.g. "0.1.0". Static string. Thread-safe. */
ZD_API const char* zd_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

typedef int32_t zd_status;
enum {
  ZD_OK = 0,
  ZD_ERR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or malformed argument */
  ZD_ERR_INVALID_STATE = 2,    /* a call out of order (step inside a forward, ...) */
  ZD_ERR_NOT_FOUND = 3,        /* unknown module, parameter or plugin */
  ZD_ERR_SHAPE_MISMATCH = 4,   /* a size or shape that does not match the parameter */
  ZD_ERR_CONFIG = 5,           /* the job script is wrong; the message names file:line */
  ZD_ERR_PLUGIN = 6,           /* a plugin could not be loaded or refused its config */
  ZD_ERR_OUT_OF_MEMORY = 7,    /* the system refused memory */
  ZD_ERR_BUDGET = 8,           /* a tier's budget would be exceeded; the message has the table */
  ZD_ERR_IO = 9,               /* a file or device error; the message names the path */
  ZD_ERR_NOT_IMPLEMENTED = 10, /* the feature is not built yet */
  ZD_ERR_VERSION = 11,         /* an ABI version mismatch (caller, plugin, daemon) */
  ZD_ERR_PEER_LOST = 12,       /* another rank or the daemon went away */
  ZD_ERR_TIMEOUT = 13,         /* a wait on another rank timed out; the message says who is where */
  ZD_ERR_BUFFER_TOO_SMALL = 14,/* an output buffer is too small; the needed size is reported */
  ZD_ERR_INTERNAL = 15         /* a bug in zerod: please report the message */
};

/* The name of a status, e.g. "ZD_ERR_CONFIG". Never NULL. Thread-safe. */
ZD_API const char* zd_status_str(zd_status status);

/* The message of the last failed call made by this thread, or "" if none.
 * Valid until this thread's next zerod call. Thread-safe (thread-local). */
ZD_API const char* zd_last_error(void);

/* ------------------------------------------------------------------------ */
/* Enumerations                                                              */
/* ------------------------------------------------------------------------ */

typedef int32_t zd_dtype;
enum {
  ZD_DTYPE_F32 = 1,
  ZD_DTYPE_BF16 = 2,
  ZD_DTYPE_F16 = 3
};

/* Memory tiers, from fastest to largest. On a CPU rank the device tier is a
 * bounded shared-memory pool, so budgets behave as they would on a GPU. */
typedef int32_t zd_tier;
enum {
  ZD_TIER_DEVICE = 0,
  ZD_TIER_HOST = 1,
  ZD_TIER_NVME = 2,
  ZD_TIER_COUNT = 3
};

/* What the bytes of a tier hold. */
typedef int32_t zd_mem_kind;
enum {
  ZD_MEM_ALL = -1,      /* the sum over every kind */
  ZD_MEM_PARAMS = 0,    /* working copies the trainer computes with */
  ZD_MEM_GRADS = 1,     /* accumulated gradients */
  ZD_MEM_MASTER = 2,    /* fp32 master copies */
  ZD_MEM_OPTIMIZER = 3, /* optimizer state (momentum, variance, ...) */
  ZD_MEM_BUFFERS = 4,   /* transient buffers: gradient views, staging */
  ZD_MEM_KIND_COUNT = 5
};

/* ------------------------------------------------------------------------ */
/* Client: a connection to an engine (embedded or a daemon)                  */
/* ------------------------------------------------------------------------ */

typedef struct zd_client zd_client;

typedef struct zd_connect_options {
  uint32_t struct_size;
  /* The ABI the caller was built against, (major << 16) | minor. 0 means
   * "same as the library". A newer major than the library's is refused. */
  uint32_t abi_version;
  /* Milliseconds any wait on another rank or the daemon may take before it
   * fails with ZD_ERR_TIMEOUT; 0 = the job script's value. With a daemon,
   * a call that times out may still be running there: that connection
   * then takes no more calls (each fails with ZD_ERR_TIMEOUT naming it);
   * destroy its models, zd_disconnect and connect again. */
  uint32_t timeout_ms;
  uint32_t reserved;
} zd_connect_options;

#define ZD_CONNECT_OPTIONS_INIT {sizeof(zd_connect_options), ZD_ABI_VERSION, 0, 0}

/* Connects to an engine.
 *   uri "embedded:"        the engine runs in this process, one rank.
 *   uri "unix:/path.sock"  a zerod daemon; rank and world size come from
 *                          ZEROD_RANK and ZEROD_WORLD_SIZE.
 *   uri NULL or ""         ZEROD_ENDPOINT from the environment (as set by
 *                          `zerod run`); else, in a rank that another
 *                          launcher started (torchrun, mpirun, srun...), its
 *                          node's daemon, started on demand (docs/daemon.md);
 *                          else embedded.
 * options may be NULL (defaults). On failure *out is NULL and zd_last_error()
 * says why. Thread-safe. */
ZD_API zd_status zd_connect(const char* uri, const zd_connect_options* options,
                            zd_client** out);

/* Disconnects and frees the client and every model still open on it.
 * NULL is a no-op. Not concurrent with other calls on the same client. */
ZD_API void zd_disconnect(zd_client* client);

typedef struct zd_client_info {
  uint32_t struct_size;
  int32_t rank;        /* this trainer's rank, 0-based */
  int32_t world_size;  /* number of ranks in the job */
  int32_t local_rank;  /* rank on this node */
  int32_t embedded;    /* 1 in embedded mode, 0 when connected to a daemon */
} zd_client_info;

#define ZD_CLIENT_INFO_INIT {sizeof(zd_client_info), 0, 0, 0, 0}

ZD_API zd_status zd_client_get_info(const zd_client* client, zd_client_info* out);

/* ------------------------------------------------------------------------ */
/* Model: the state of one job                                               */
/* ------------------------------------------------------------------------ */

typedef struct zd_model zd_model;
typedef int32_t zd_param_id;  /* dense, 0-based, in registration order */
typedef int32_t zd_module_id; /* dense, 0-based, in order of first mention */

/* Flags for zd_model_options.flags. */
enum {
  /* Lets the job script use Lua's io library (it is sandboxed away otherwise). */
  ZD_MODEL_ALLOW_SCRIPT_IO = 1u << 0
};

typedef struct zd_model_options {
  uint32_t struct_size;
  uint32_t flags;
  /* One of the two: a path to a Lua job script, or its text. With neither,
   * the script ZEROD_JOB names (as `zerod run --job` sets it). */
  const char* script_path;
  const char* script_text;
  /* The name errors use for a script given as text ("job.lua" if NULL). */
  const char* script_name;
  /* Since 1.1. The device the trainer computes on, overriding the job
   * script's `device`: "cpu", "cuda" or "auto"; NULL = the script's (whose
   * default is "cpu"). Views point into this device's memory, so a trainer
   * says where it computes (zerod.torch passes its module's device). */
  const char* device;
} zd_model_options;

#define ZD_MODEL_OPTIONS_INIT {sizeof(zd_model_options), 0, NULL, NULL, NULL, NULL}

/* Creates a model from a job script. The script is loaded, run in a sandbox
 * and checked against the schema before this returns; every error it has is
 * reported together, each with file:line (ZD_ERR_CONFIG). The optimizer plugin
 * named by the script is loaded now (ZD_ERR_PLUGIN, ZD_ERR_VERSION). */
ZD_API zd_status zd_model_create(zd_client* client, const zd_model_options* options,
                                 zd_model** out);

/* Frees the model and all its state. NULL is a no-op. */
ZD_API void zd_model_destroy(zd_model* model);

/* The message of the last failed call on this model, or "". Valid until the
 * next call on the model. */
ZD_API const char* zd_model_last_error(const zd_model* model);

#define ZD_MAX_DIMS 8

typedef struct zd_param_desc {
  uint32_t struct_size;
  zd_dtype dtype;            /* the working copy's type: F32, or the job's 16-bit precision */
  const char* name;          /* unique within the model */
  const char* module;        /* the module it belongs to (the unit of residency) */
  int32_t ndim;              /* 1..ZD_MAX_DIMS */
  const int64_t* shape;      /* ndim positive extents */
  const void* init;          /* initial values, numel elements of init_dtype; NULL = zeros */
  zd_dtype init_dtype;       /* 0 = same as dtype */
} zd_param_desc;

#define ZD_PARAM_DESC_INIT {sizeof(zd_param_desc), ZD_DTYPE_F32, NULL, NULL, 0, NULL, NULL, 0}

/* Registers a parameter (before finalize). Every rank registers the same
 * parameters in the same order; rank 0's initial values are used. */
ZD_API zd_status zd_model_register_param(zd_model* model, const zd_param_desc* desc,
                                         zd_param_id* out_id);

/* Places and allocates the model state. After this no parameter can be
 * added. A placement that does not fit a tier's budget is refused with a
 * per-tier table (ZD_ERR_BUDGET); a second finalize is ZD_ERR_INVALID_STATE.
 * In a job of several ranks it returns once every rank has finalized. */
ZD_API zd_status zd_model_finalize(zd_model* model);

/* Looks up a module by name. */
ZD_API zd_status zd_model_find_module(const zd_model* model, const char* name,
                                      zd_module_id* out_id);
/* Looks up a parameter by name. */
ZD_API zd_status zd_model_find_param(const zd_model* model, const char* name,
                                     zd_param_id* out_id);
ZD_API zd_status zd_model_param_count(const zd_model* model, int32_t* out_count);
ZD_API zd_status zd_model_module_count(const zd_model* model, int32_t* out_count);

typedef struct zd_param_info {
  uint32_t struct_size;
  zd_dtype dtype;
  const char* name;          /* owned by the model */
  zd_module_id module;
  int32_t ndim;
  int64_t shape[ZD_MAX_DIMS];
  int64_t numel;
} zd_param_info;

#define ZD_PARAM_INFO_INIT {sizeof(zd_param_info), 0, NULL, 0, 0, {0}, 0}

ZD_API zd_status zd_model_param_info(const zd_model* model, zd_param_id id,
                                     zd_param_info* out);

/* The module's name (owned by the model) and its parameters. *inout_count is
 * the capacity of ids on entry and the module's parameter count on return;
 * if it is too small, ZD_ERR_BUFFER_TOO_SMALL (ids may be NULL to ask). */
ZD_API zd_status zd_model_module_info(const zd_model* model, zd_module_id id,
                                      const char** out_name, zd_param_id* ids,
                                      int32_t* inout_count);

/* ------------------------------------------------------------------------ */
/* One training step                                                         */
/* ------------------------------------------------------------------------ */
/*
 * Per micro-batch:
 *   for each module in forward order:   forward_begin, compute, forward_end
 *   for each module in reverse order:   backward_begin, write/accumulate
 *                                       gradients into its views, backward_end
 *   step()
 * A module may run more than once in a micro-batch (weight tying) and a
 * forward may run inside a backward (activation recomputation). Modules may
 * nest. step() is called after every micro-batch; it applies the optimizer at
 * each gradient-accumulation boundary of the job script.
 *
 * Gradient views are zero at backward_begin; whatever the trainer leaves in
 * them at backward_end is added to the parameter's gradient. The engine
 * averages gradients over micro-batches and ranks, so a trainer reports the
 * gradient of its own micro-batch's mean loss (times the loss scale, in fp16).
 *
 * A call made out of order fails with ZD_ERR_INVALID_STATE and changes
 * nothing; the model stays usable.
 *
 * Through a zerod daemon, zd_forward_end of a module this rank began in
 * forward returns once the client has checked it, and the daemon runs it
 * just before the rank's next call (no other rank waits for it; a pair then
 * costs one round trip). An error only the daemon can see there (a lost
 * peer, ranks in different modules) is returned by that next call, which
 * then does not run; the message says so (the module's views ended at the
 * zd_forward_end already; such errors leave the job broken, so nothing
 * else is left half done). ZEROD_SYNC_END=1 in the environment makes
 * zd_forward_end wait for the daemon instead.
 */

ZD_API zd_status zd_forward_begin(zd_model* model, zd_module_id module);
ZD_API zd_status zd_forward_end(zd_model* model, zd_module_id module);
ZD_API zd_status zd_backward_begin(zd_model* model, zd_module_id module);
ZD_API zd_status zd_backward_end(zd_model* model, zd_module_id module);

/* Flags of zd_view.flags. */
enum {
  ZD_VIEW_READ_ONLY = 1u << 0 /* the trainer must not write (parameters) */
};

/* Device types of zd_view.device_type (the same numbers as DLPack's). */
enum {
  ZD_DEVICE_CPU = 1,
  ZD_DEVICE_CUDA = 2
};

/* A contiguous, row-major tensor in zerod's memory. */
typedef struct zd_view {
  uint32_t struct_size;
  uint32_t flags;
  void* data;
  uint64_t nbytes;
  zd_dtype dtype;
  int32_t ndim;
  int64_t shape[ZD_MAX_DIMS];
  int32_t device_type;
  int32_t device_id;
  /* Where the bytes live in the device pool's regions: arena id and byte
   * offset. In daemon mode, a region the daemon passed this process; embedded
   * on the cpu device, one of its own memfd arenas; -1 where the pool is not
   * made of such regions (embedded on a GPU). */
  int32_t arena;
  int32_t reserved;
  uint64_t offset;
} zd_view;

#define ZD_VIEW_INIT {sizeof(zd_view), 0, NULL, 0, 0, 0, {0}, 0, 0, -1, 0, 0}

/* The working copy of a parameter whose module is between forward_begin and
 * forward_end, or between backward_begin and backward_end. Read-only. Valid
 * until that module's matching _end. */
ZD_API zd_status zd_param_view(zd_model* model, zd_param_id param, zd_view* out);

/* The gradient buffer of a parameter whose module is between backward_begin
 * and backward_end; the parameter's dtype. Valid until backward_end. */
ZD_API zd_status zd_grad_view(zd_model* model, zd_param_id param, zd_view* out);

/* Flags of zd_step_result.flags. */
enum {
  ZD_STEP_BOUNDARY = 1u << 0, /* this call ended a gradient-accumulation window */
  ZD_STEP_APPLIED = 1u << 1,  /* the optimizer updated the parameters */
  ZD_STEP_SKIPPED = 1u << 2   /* inf/nan gradients: no update (the loss scale may be lowered) */
};

typedef struct zd_step_result {
  uint32_t struct_size;
  uint32_t flags;
  int64_t step;        /* optimizer steps applied so far (skipped ones excluded) */
  int64_t micro_step;  /* micro-batches seen so far */
  double lr;           /* the learning rate used (or that would have been used) */
  double loss_scale;   /* the loss scale to use for the next micro-batch */
  double grad_norm;    /* global L2 norm of the averaged, unscaled gradient, before clipping */
} zd_step_result;

#define ZD_STEP_RESULT_INIT {sizeof(zd_step_result), 0, 0, 0, 0.0, 0.0, 0.0}

/* Ends a micro-batch; at an accumulation boundary: overflow check, unscale,
 * global-norm clipping, the learning rate (the script's schedule, or the
 * trainer's: zd_model_set_lr), the optimizer. out may be NULL.
 * ZD_ERR_INVALID_STATE while any module is begun. */
ZD_API zd_status zd_step(zd_model* model, zd_step_result* out);

/* Since 1.7. Sets the learning rate of every update from the next
 * accumulation boundary on, in place of the job's schedule (the script's
 * lr(step), or its optimizer's lr): for a schedule the trainer computes (a
 * hand-written warm-up and decay, one that follows the loss). Every
 * optimizer takes it as it takes the schedule's. It holds until set again;
 * no call hands back to the script's schedule (a new model starts on it,
 * and a zd_model_load of a checkpoint saved while none was set goes back
 * to it). It is part of the model's state, as the step is: zd_model_save,
 * snapshots and a model the daemon keeps for a restart hold it, and a load
 * or a resume restores it. zd_step_result.lr says the lr an update used.
 * Finite and >= 0 (ZD_ERR_INVALID_ARGUMENT otherwise). After finalize,
 * anywhere between modules, inside an accumulation window too
 * (ZD_ERR_INVALID_STATE while a module is begun). On several ranks it is a
 * collective: every rank calls it with the same value; where they differ
 * every rank gets ZD_ERR_INVALID_ARGUMENT naming the lowest and highest, and
 * the lr in force stays. */
ZD_API zd_status zd_model_set_lr(zd_model* model, double lr);

/* The loss scale the trainer multiplies its loss by (1.0 unless fp16). */
ZD_API zd_status zd_model_loss_scale(const zd_model* model, double* out);

/* Since 1.1. The stream the trainer computes on, on a cuda device: a
 * cudaStream_t, or NULL for the default stream. Begin calls make this stream
 * wait for zerod's copies instead of blocking the host; backward_end makes
 * zerod's reduction wait for what the trainer issued on it. Between steps
 * (ZD_ERR_INVALID_STATE while a module is begun). On the cpu device only
 * NULL is accepted (ZD_ERR_INVALID_ARGUMENT otherwise). Under a daemon
 * that serves the rank's GPU the same holds across the process boundary
 * (stream signals in a host page both processes map order this stream and
 * the daemon's). */
ZD_API zd_status zd_model_set_stream(zd_model* model, void* stream);

/* Since 1.3. What the trainer processed since its last report, and its
 * loss: zerod's live metrics (tokens and samples per second, the loss) and
 * the trace's loss curve come from these (docs/observability.md). */
typedef struct zd_progress {
  uint32_t struct_size;
  uint32_t flags;      /* ZD_PROGRESS_HAS_LOSS when loss is set */
  uint64_t tokens;     /* tokens this rank processed since its last report (0: not counted) */
  uint64_t samples;    /* samples (sequences, images) likewise */
  double loss;         /* this rank's loss, e.g. of its last micro-batch; NaN and inf are taken as they are */
  uint64_t reserved;   /* 0 */
} zd_progress;

enum { ZD_PROGRESS_HAS_LOSS = 1 };

#define ZD_PROGRESS_INIT {sizeof(zd_progress), 0, 0, 0, 0.0, 0}

/* Since 1.3. Reports the trainer's progress, typically once per zd_step; it
 * is recorded against the optimizer steps applied so far. Any time after
 * zd_model_create, from the rank's own thread; it changes nothing in
 * training. ZD_ERR_INVALID_ARGUMENT for NULL, unknown flags or a nonzero
 * reserved field. */
ZD_API zd_status zd_model_report(zd_model* model, const zd_progress* progress);

/* ------------------------------------------------------------------------ */
/* Whole-parameter access (evaluation, export, checkpoints)                  */
/* ------------------------------------------------------------------------ */

/* Copies the full fp32 master value of a parameter into dst, converted to
 * dtype. bytes must be numel * sizeof(dtype). After finalize. With ZeRO
 * stage 1 or more on several ranks it is a collective: every rank reads the
 * same parameter, in the same order. */
ZD_API zd_status zd_param_read(zd_model* model, zd_param_id param, zd_dtype dtype,
                               void* dst, uint64_t bytes);

/* Overwrites a parameter's master and working copies from src (numel
 * elements of dtype). Optimizer state is kept. After finalize, while no
 * module is begun. On several ranks every rank writes the same value. */
ZD_API zd_status zd_param_write(zd_model* model, zd_param_id param, zd_dtype dtype,
                                const void* src, uint64_t bytes);

/* ------------------------------------------------------------------------ */
/* Optimizer state, for checkpoints                                          */
/* ------------------------------------------------------------------------ */
/* A checkpoint is what the trainer writes: each parameter (zd_param_read),
 * each of its optimizer state slots (zd_optimizer_state_read) and the step
 * (zd_model_optimizer_info). Loading is the reverse, after finalize:
 * zd_param_write, zd_optimizer_state_write, zd_model_set_step. */

#define ZD_MAX_STATE_SLOTS 4

typedef struct zd_optimizer_info {
  uint32_t struct_size;
  int32_t state_slots;        /* fp32 arrays per parameter element */
  int64_t step;               /* optimizer updates applied so far (this rank) */
  const char* name;           /* the optimizer plugin, e.g. "adamw" */
  const char* slot_names[ZD_MAX_STATE_SLOTS]; /* e.g. "exp_avg"; NULL past state_slots */
} zd_optimizer_info;          /* strings are valid while the model lives */

#define ZD_OPTIMIZER_INFO_INIT {sizeof(zd_optimizer_info), 0, 0, NULL, {NULL, NULL, NULL, NULL}}

ZD_API zd_status zd_model_optimizer_info(const zd_model* model, zd_optimizer_info* out);

/* One state slot of a parameter, whole, converted to dtype; bytes must be
 * numel * sizeof(dtype). Like zd_param_read, a collective when the state is
 * partitioned (ZeRO stage >= 1) on several ranks. */
ZD_API zd_status zd_optimizer_state_read(zd_model* model, zd_param_id param, int32_t slot,
                                         zd_dtype dtype, void* dst, uint64_t bytes);
/* Overwrites a state slot of a parameter; every rank writes the same value,
 * between steps. */
ZD_API zd_status zd_optimizer_state_write(zd_model* model, zd_param_id param, int32_t slot,
                                          zd_dtype dtype, const void* src, uint64_t bytes);
/* Since 1.2. Writes a checkpoint of the model state into `dir` (created if
 * need be): each rank's shard of the fp32 masters and optimizer state,
 * streamed, then a manifest with the step and loss scale
 * (docs/checkpoints.md). A collective: every rank calls it, between steps
 * (ZD_ERR_INVALID_STATE inside an accumulation window). Returns once the
 * checkpoint is whole on every rank; a directory without the manifest holds
 * none. ZD_ERR_IO names the file on a full disk or a failed write. */
ZD_API zd_status zd_model_save(zd_model* model, const char* dir);
/* Since 1.2. Loads a checkpoint zd_model_save wrote, at any world size and
 * ZeRO stage: each rank reads what it holds now; the working copies follow
 * the masters; the step, the loss scale and the optimizer's per-tensor
 * scalars (1-bit LAMB's frozen trust ratios, 0/1 Adam's sum of learning
 * rates since its last sync) are restored. A checkpoint written before
 * checkpoints held those scalars is ZD_ERR_CONFIG where the next update
 * would read them (docs/checkpoints.md). A collective,
 * between steps, after finalize. Another model's checkpoint (other
 * parameter names or shapes) is ZD_ERR_SHAPE_MISMATCH naming the parameter,
 * another optimizer's ZD_ERR_CONFIG; a damaged file ZD_ERR_IO naming it.
 * Gradients of a backward that no zd_step applied are dropped: training
 * goes on from the checkpoint. */
ZD_API zd_status zd_model_load(zd_model* model, const char* dir);

/* Sets the count of applied updates (restoring a checkpoint: bias
 * correction, the lr schedule and 1-bit Adam's phase follow it), 0..2^53-1
 * (ZD_ERR_INVALID_ARGUMENT otherwise: update numbers reach the optimizer and
 * the lr schedule as doubles). Every rank the same value, between steps. A compressing optimizer's error feedback
 * restarts at zero; the scalars it keeps per tensor stay as they are (the
 * whole-tensor calls cannot restore them into a new model: zd_model_load
 * does). Where the next update reads them and the model holds none (no
 * update ran in it, no checkpoint holding them was loaded) it is
 * ZD_ERR_CONFIG and changes nothing: 1-bit LAMB would not move again.
 * Gradients of a backward that no zd_step applied are dropped, as on a
 * load. */
ZD_API zd_status zd_model_set_step(zd_model* model, int64_t step);

/* ------------------------------------------------------------------------ */
/* Memory accounting                                                         */
/* ------------------------------------------------------------------------ */

typedef struct zd_memory_figures {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t current; /* bytes held now */
  uint64_t peak;    /* the most held at once since finalize */
  uint64_t budget;  /* the tier's budget for this rank; UINT64_MAX if none */
} zd_memory_figures;

#define ZD_MEMORY_FIGURES_INIT {sizeof(zd_memory_figures), 0, 0, 0, 0}

/* Bytes of one kind (or ZD_MEM_ALL) in one tier, for one rank (-1 = the
 * caller's rank). Exact: every allocation zerod makes for model state is
 * counted, and so are the host copies it works on where the host cannot
 * address the device (host buffers; docs/abi.md "Memory figures"). */
ZD_API zd_status zd_model_memory(const zd_model* model, int32_t rank, zd_tier tier,
                                 zd_mem_kind kind, zd_memory_figures* out);

/* ------------------------------------------------------------------------ */
/* Communication figures                                                     */
/* ------------------------------------------------------------------------ */

typedef struct zd_comm_figures {
  uint32_t struct_size;
  uint32_t reserved;
  /* Bytes this rank sent to other ranks, as a ring would put them on links:
   * all-reduce 2(N-1)/N of the buffer, reduce-scatter and all-gather N-1
   * chunks, all-to-all N-1 blocks; compressed all-reduce: its packed bits
   * and scales. */
  uint64_t bytes_sent;
  /* Bytes this rank's node (daemon) sent to other nodes; 0 on one node. */
  uint64_t network_bytes_sent;
  /* Collectives this rank has completed. */
  uint64_t collectives;
} zd_comm_figures;

#define ZD_COMM_FIGURES_INIT {sizeof(zd_comm_figures), 0, 0, 0, 0}

/* Traffic of one rank's collectives so far (-1 = the caller's rank). */
ZD_API zd_status zd_model_comm_figures(const zd_model* model, int32_t rank, zd_comm_figures* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZEROD_ZEROD_H */
