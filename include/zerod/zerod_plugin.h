/*
 * zerod_plugin.h — the plugin ABI (each kind's descriptor versions below).
 *
 * A plugin is a shared object that zerod loads with dlopen. It exports one C
 * function, zd_plugin_descriptors(), returning a NULL-terminated array of
 * const descriptors: one per (kind, ABI version) the plugin supports. Every
 * descriptor begins with zd_plugin_header. The host takes the newest version
 * of the kind it wants that it understands, and refuses a plugin that offers
 * none with "expected X, got Y".
 *
 * A plugin never links the engine: what it needs from the host (logging, and
 * in later versions memory in a tier and communication) comes in the
 * zd_host_services table passed to its create function. A plugin never lets a
 * C++ exception escape.
 */
#ifndef ZEROD_ZEROD_PLUGIN_H
#define ZEROD_ZEROD_PLUGIN_H

#include <zerod/zerod.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the plugin's one exported function. */
#define ZD_PLUGIN_EXPORT __attribute__((visibility("default")))

/* The name of the exported function, and its type. */
#define ZD_PLUGIN_ENTRY_SYMBOL "zd_plugin_descriptors"
typedef const struct zd_plugin_header* const* (*zd_plugin_entry_fn)(void);

/* What a plugin defines (declared here so the compiler checks its signature;
 * the host finds it with dlsym, never by linking). */
ZD_PLUGIN_EXPORT const struct zd_plugin_header* const* zd_plugin_descriptors(void);

typedef int32_t zd_plugin_kind;
enum {
  ZD_PLUGIN_OPTIMIZER = 1,
  ZD_PLUGIN_PARTITIONER = 2,
  ZD_PLUGIN_TIER = 3,
  ZD_PLUGIN_COMM = 4
};

/* The newest descriptor version this header defines, per kind. A plugin may
 * list older versions beside it; the host takes the newest it knows. */
#define ZD_OPTIMIZER_ABI_VERSION 4
#define ZD_COMM_ABI_VERSION 3
#define ZD_PARTITIONER_ABI_VERSION 1
#define ZD_TIER_ABI_VERSION 1

typedef struct zd_plugin_header {
  zd_plugin_kind kind;
  uint32_t struct_size;     /* sizeof the whole descriptor */
  uint32_t abi_version;     /* the layout version of this kind's descriptor */
  uint32_t plugin_version;  /* the plugin's own release, (major << 16) | minor */
  const char* name;         /* e.g. "adamw"; what job scripts name */
  const char* description;  /* one line, for `zerod check` and logs */
} zd_plugin_header;

/* ------------------------------------------------------------------------ */
/* Host services                                                             */
/* ------------------------------------------------------------------------ */

typedef int32_t zd_log_level;
enum { ZD_LOG_ERROR = 0, ZD_LOG_WARN = 1, ZD_LOG_INFO = 2, ZD_LOG_DEBUG = 3 };

typedef struct zd_host_services {
  uint32_t struct_size;
  uint32_t abi_version;  /* ZD_ABI_VERSION of the host */
  void* host;            /* pass back as the first argument */
  void (*log)(void* host, zd_log_level level, const char* plugin, const char* message);
} zd_host_services;

/* ------------------------------------------------------------------------ */
/* Hyperparameters a plugin accepts from the job script                      */
/* ------------------------------------------------------------------------ */
/* The host checks the job script's table against these specs (unknown keys,
 * types, ranges) and reports errors with file:line; the plugin receives the
 * resolved values, defaults filled in, as doubles in spec order (a spec with
 * count n takes n consecutive doubles; bools are 0 or 1). A bound that does
 * not apply is -INFINITY / INFINITY. create() reports a value or combination
 * it refuses with ZD_ERR_CONFIG and a message naming the hyperparameter. */

typedef int32_t zd_hparam_type;
enum { ZD_HPARAM_NUMBER = 1, ZD_HPARAM_INTEGER = 2, ZD_HPARAM_BOOL = 3 };

enum {
  ZD_HPARAM_MIN_EXCLUSIVE = 1u << 0, /* value > min rather than >= min */
  ZD_HPARAM_MAX_EXCLUSIVE = 1u << 1  /* value < max rather than <= max */
};

#define ZD_HPARAM_MAX_COUNT 4

typedef struct zd_hparam_spec {
  const char* name;
  zd_hparam_type type;
  int32_t count;                          /* 1, or a fixed-length list (e.g. 2 for betas) */
  double defaults[ZD_HPARAM_MAX_COUNT];
  double min;                             /* per element */
  double max;
  uint32_t flags;
  const char* help;
} zd_hparam_spec;

/* ------------------------------------------------------------------------ */
/* Optimizer plugins (kind ZD_PLUGIN_OPTIMIZER, version 1)                   */
/* ------------------------------------------------------------------------ */

#define ZD_OPTIMIZER_MAX_STATE 4

/* Kernel instruction sets. ZD_ISA_AUTO picks the best the CPU has. */
typedef int32_t zd_isa;
enum { ZD_ISA_AUTO = 0, ZD_ISA_SCALAR = 1, ZD_ISA_AVX2 = 2, ZD_ISA_AVX512 = 3 };

/* One update of a contiguous range of elements. The host splits a shard into
 * ranges and may call update() on disjoint ranges from several threads at
 * once; a range's element i of every array belongs to the same parameter
 * element. Pointers are CPU memory for update(), device memory for
 * update_cuda(). */
typedef struct zd_optimizer_update {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t count;           /* elements in the range */
  float* master;            /* fp32 master values, updated in place */
  const void* grad;         /* gradients, grad_dtype */
  void* work;               /* working copy written in the same pass, or NULL */
  float* state[ZD_OPTIMIZER_MAX_STATE]; /* state slots, state_slots() of them: fp32 arrays, or
                                           uint16_t bf16 arrays where state_dtype says so (v4) */
  zd_dtype grad_dtype;
  zd_dtype work_dtype;      /* ignored when work is NULL */
  double grad_scale;        /* multiply each gradient by this first (unscale, average, clip) */
  double lr;                /* the learning rate to use: the job's schedule, else its
                               "lr" hyperparameter; a plugin always uses this one */
  int64_t step;             /* 1 for the first update, counting only applied steps */

  /* Optimizer ABI version 3 (zd_optimizer_v3) adds what follows; a plugin of
   * an older version reads only the fields above (ZD_OPTIMIZER_UPDATE_V1_SIZE
   * bytes), a v3 plugin checks struct_size >= sizeof(zd_optimizer_update). */
  uint32_t kind;            /* the step's kind, as the plugin's plan() wrote it */
  uint32_t pass;            /* update(): which pass of the step, 1..; prepare(): 0 */
  float* exchange;          /* the exchange buffer over the same elements, or NULL (see zd_optimizer_plan) */
  const float* tensor;      /* the tensor's scalars (tensor_scalars() of them) or NULL; read only */
  double* stats;            /* update(): the range's statistics, tensor_stats() of them, zero on entry;
                               the plugin adds its range's part (ZD_STAT_SUM) or raises it (ZD_STAT_MAX) */
  int32_t exchange_in;      /* prepare(): what `exchange` holds on entry (ZD_EXCHANGE_IN_*) */
  /* Optimizer ABI version 4 (zd_optimizer_v4), in place of v3's reserved3:
   * what the state[] pointers point at. 0 or ZD_DTYPE_F32: fp32 arrays, as
   * before; ZD_DTYPE_BF16: arrays of bf16 (uint16_t, the top half of an
   * fp32) behind the float* pointers, which the plugin widens to fp32,
   * updates in fp32 and stores back rounded to nearest even. The host passes
   * a dtype other than fp32 only to a v4 plugin whose
   * supports_state_dtype() accepted it; a plugin of an older version never
   * sees one (it read this field as reserved, and the host wrote 0). */
  zd_dtype state_dtype;
} zd_optimizer_update;

/* The bytes of zd_optimizer_update that optimizer ABI versions 1 and 2 know. */
#define ZD_OPTIMIZER_UPDATE_V1_SIZE (offsetof(zd_optimizer_update, step) + sizeof(int64_t))

typedef struct zd_optimizer_v1 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_OPTIMIZER, abi_version 1 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;

  /* Makes an instance from resolved hyperparameters. On failure writes a
   * message naming the hyperparameter into err (err_size bytes). */
  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);

  /* fp32 state arrays needed per element (0..ZD_OPTIMIZER_MAX_STATE); the
   * host allocates them zeroed. */
  uint32_t (*state_slots)(const void* instance);
  /* Names of the state slots, e.g. "exp_avg"; used for accounting and
   * checkpoints. */
  const char* (*state_name)(const void* instance, uint32_t slot);

  /* Whether this plugin and CPU can run a kernel of that instruction set. */
  int32_t (*supports_isa)(zd_isa isa);

  /* Applies one update on the CPU. Thread-safe on disjoint ranges.
   * ZD_ERR_NOT_IMPLEMENTED if isa is not supported; ZD_ERR_INVALID_ARGUMENT
   * for a dtype it cannot handle. */
  zd_status (*update)(const void* instance, zd_isa isa, const zd_optimizer_update* u);

  /* The same on a CUDA stream (cudaStream_t passed as void*), or NULL when
   * the plugin was built without CUDA. */
  zd_status (*update_cuda)(const void* instance, const zd_optimizer_update* u, void* stream);
} zd_optimizer_v1;

/* Version 2: v1, then what an optimizer that communicates its own state
 * instead of gradients needs (1-bit Adam). The first fields are v1's, in
 * v1's order. A v2 plugin whose compression_start() returns 0 behaves as v1.
 *
 * From update number compression_start() on (1-based, counting applied
 * steps), the host does not average gradients across ranks. Instead, per
 * step:
 *   1. momentum() on every range of the rank's local gradient: grad_scale
 *      unscales, averages over micro-batches and clips, but does not divide
 *      by the number of ranks. It updates state slot momentum_slot() from the
 *      local gradient (e.g. m = beta1 m + (1 - beta1) g).
 *   2. The host averages that slot across ranks with the comm plugin's
 *      compressed_all_reduce (zd_comm_v2), keeping the error feedback
 *      buffers itself (zero at start; a checkpoint loaded by as many ranks
 *      as saved it brings them back, any other load starts them at zero).
 *   3. update() on every range; it must not fold the gradient in again (the
 *      grad pointer is then NULL).
 * Before that update, steps are v1 steps: averaged gradients, then update().
 * Global grad-norm clipping in the compression phase uses the square root of
 * the mean over ranks of the local squared norms. */
typedef struct zd_optimizer_v2 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_OPTIMIZER, abi_version 2 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;
  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);
  uint32_t (*state_slots)(const void* instance);
  const char* (*state_name)(const void* instance, uint32_t slot);
  int32_t (*supports_isa)(zd_isa isa);
  zd_status (*update)(const void* instance, zd_isa isa, const zd_optimizer_update* u);
  zd_status (*update_cuda)(const void* instance, const zd_optimizer_update* u, void* stream);

  /* The first update whose momentum is compressed instead of its gradient
   * averaged; 0 = never (a plain optimizer). */
  int64_t (*compression_start)(const void* instance);
  /* The state slot the host averages (compressed) across ranks. */
  uint32_t (*momentum_slot)(const void* instance);
  /* Step 1 above on one range (u->work is NULL, u->master unchanged).
   * Thread-safe on disjoint ranges. */
  zd_status (*momentum)(const void* instance, zd_isa isa, const zd_optimizer_update* u);
} zd_optimizer_v2;

/* Version 3: an optimizer that plans each step. v2 fixed one protocol (1-bit
 * Adam's: averaged gradients before compression_start(), then local
 * momentum, its compressed average and an update); v3 lets the plugin say,
 * step by step, what the host does, so that 0/1 Adam (1-bit gradients,
 * variance updated at chosen steps, local steps) and 1-bit LAMB (per-tensor
 * trust ratios, one fused compressed buffer) fit as well. The first fields
 * are v1's, in v1's order. The host lifts v1 and v2 plugins to this table.
 *
 * Per applied step t (1-based) the host calls plan(t, warmup, sync, &plan),
 * where warmup and sync are the answers of the job's schedules
 * compression.warmup(t - 1) and compression.sync(t - 1) (Lua functions of
 * the step, like lr(step): 1 true, 0 false), or -1 when the job defines no
 * such function and the plugin's own schedule (its hyperparameters) holds.
 * plan() is a pure function of its arguments: the host may call it again for
 * the same step (a restart) and expects the same plan. The plan says:
 *
 *   grads: ZD_GRADS_AVERAGED — the ranks' gradients are averaged in full
 *          precision (reduced to their owners at ZeRO stages 1-3), as for
 *          any optimizer; ZD_GRADS_LOCAL — each rank keeps its own whole
 *          gradient (its global norm for clipping is the square root of the
 *          mean over ranks of the local squared norms).
 *   ops:   what runs, in order (ZD_OP_END ends the list):
 *     ZD_OP_PREPARE   prepare() over each tensor of the rank's whole local
 *                     gradient, writing the exchange buffer (whole tensors,
 *                     every rank). On entry the buffer holds zeros
 *                     (ZD_EXCHANGE_IN_ZERO) when the plan does not set
 *                     keep_average; when it does, the average the last
 *                     exchange kept (ZD_EXCHANGE_IN_AVERAGE: at ZeRO stages
 *                     1-3 rebuilt from the kept bits, at stage 0 the
 *                     exchange buffer itself, left as that step's passes
 *                     read it), or, when none is kept (the first such step,
 *                     after a checkpoint load, a state write or a step of
 *                     another plan), the whole of state slot
 *                     average_slot(), gathered from its owners
 *                     (ZD_EXCHANGE_IN_SLOT).
 *     ZD_OP_EXCHANGE  the 1-bit compressed average of the exchange buffer
 *                     across ranks (zd_comm_v2::compressed_all_reduce), with
 *                     error feedback the host keeps per rank: each tensor on
 *                     its own (one worker scale per tensor), or with fused
 *                     set all tensors of a parameter group packed as one
 *                     buffer (one worker scale for the group, DeepSpeed's
 *                     1-bit LAMB). Every rank ends with the same average.
 *     ZD_OP_PASS      update() over the rank's owned range (its ZeRO shard),
 *     ZD_OP_PASS_GRAD cut at tensor boundaries, without or with the
 *                     gradient. u->exchange points at the exchange buffer's
 *                     values for the same elements (after an exchange: the
 *                     average), or is NULL when the plan has no exchange.
 *   keep_average: the host keeps the average (as it is: one sign bit per
 *          element and one scale per chunk, or at stage 0 the exchange
 *          buffer) for the next ZD_EXCHANGE_IN_AVERAGE. The passes of such a
 *          plan read u->exchange and must not write it.
 *   reset_errors: the error feedback restarts at zero before this step.
 *   replay_slots: 0, or the state slots (bit k for slot k) that this step's
 *          passes read or write besides the exchange buffer and the master,
 *          element by element (the same update of an element whatever range
 *          a call covers), and that another rank needs to compute what they
 *          write to the master. The plan must be PREPARE, EXCHANGE, PASS, or
 *          (from zerod 1.5) PREPARE, EXCHANGE followed by several PASSes.
 *          A slot a pass writes from the exchange alone and no later pass
 *          reads need not be named (1-bit Adam writes m, the average slot,
 *          so names only its frozen variance, bit 1); 0/1 Adam's gradient
 *          steps name m and v (bits 0 and 1), 1-bit LAMB's compressed steps
 *          m (written by the first pass, read by the second) and v (1.5).
 *          A rank that does not own an element can then replay its update
 *          from the exchanged values and whole copies of these slots: at
 *          ZeRO stages 1-2 with compression.replay the host keeps such
 *          copies on every rank (filled by broadcast when a step is replayed
 *          after one that was not, or after a load or a state write) and
 *          runs update() over the elements other ranks own as well, with its
 *          fp32 working copy as the master, the copies as these slots, the
 *          per-tensor scalars as in the pass, any other slot on scratch
 *          memory and statistics that are thrown away (tensor_step() sees
 *          the owners' alone, combined, so every rank's scalars agree); and
 *          it does not all-gather the working copies after the step. The
 *          first pass is replayed right after the exchange, before the
 *          tensor_step() that precedes it, so that tensor_step() must not
 *          change what the first pass reads; each later pass is replayed
 *          after the owners' run of it. (Added in zerod 1.4 in place of a
 *          reserved field: a plugin built before writes 0. A host before 1.5
 *          refuses a replayed plan with more than one pass: read
 *          zd_host_services.abi_version.)
 *   kept_scalars: 1 when this step's tensor_step() or passes read per-tensor
 *          scalars that earlier steps left (1-bit LAMB's frozen trust
 *          ratios; 0/1 Adam's sum of learning rates since the last sync),
 *          so that resuming at this step needs them as they were. The host
 *          reads it from plan(step, -1, -1) for the step after a checkpoint
 *          that does not hold the scalars (one written before they were
 *          saved), and refuses to resume from it when it is set: it must
 *          not depend on warmup and sync, and may be 1 where the scalars
 *          happen to be zero. (Added in place of a reserved field: a plugin
 *          built before writes 0, and such a checkpoint loads with the
 *          scalars at zero, as before.)
 *
 * Before every ZD_OP_PASS, ZD_OP_PASS_GRAD and ZD_OP_PREPARE, and once after
 * the last op, the host calls tensor_step() once for all tensors of the
 * model: it sees the statistics the last pass gathered (each combined over
 * ranges and ranks by stat_op) and may update the per-tensor scalars, which
 * the following calls read through u->tensor. The host keeps the scalars:
 * zero at first, then as tensor_step() leaves them. They are the
 * optimizer's state as the slots are: checkpoints and snapshots hold them
 * and a load restores them, and a state write or a new step count
 * (zd_optimizer_state_write, zd_model_set_step) leaves them as they are.
 * Every rank's agree, so a checkpoint holds them once (its manifest).
 *
 * A plan whose ops write the exchange buffer in a pass (ZD_OP_EXCHANGE
 * after a pass) or use ZD_GRADS_LOCAL with a pass that reads the gradient
 * needs each rank to own everything (ZeRO stage 0); check_partitions()
 * refuses the stages a plugin's configuration cannot run with. */

typedef int32_t zd_grads;
enum { ZD_GRADS_AVERAGED = 0, ZD_GRADS_LOCAL = 1 };

typedef int32_t zd_plan_op;
enum { ZD_OP_END = 0, ZD_OP_PASS = 1, ZD_OP_PASS_GRAD = 2, ZD_OP_PREPARE = 3, ZD_OP_EXCHANGE = 4 };

enum { ZD_EXCHANGE_IN_ZERO = 0, ZD_EXCHANGE_IN_AVERAGE = 1, ZD_EXCHANGE_IN_SLOT = 2 };

/* How a statistic combines over ranges and ranks. */
typedef int32_t zd_stat_op;
enum { ZD_STAT_SUM = 1, ZD_STAT_MAX = 2 };

#define ZD_PLAN_MAX_OPS 8

typedef struct zd_optimizer_plan {
  uint32_t struct_size;
  uint32_t kind;          /* plugin-defined; passed back in every call of this step */
  zd_grads grads;
  int32_t fused;
  int32_t keep_average;
  int32_t reset_errors;
  zd_plan_op ops[ZD_PLAN_MAX_OPS];
  uint32_t replay_slots;
  uint32_t kept_scalars;
  uint32_t reserved[2];
} zd_optimizer_plan;

/* What tensor_step() sees: every tensor of the model, in registration order. */
typedef struct zd_tensor_step {
  uint32_t struct_size;
  uint32_t kind;          /* the plan's */
  zd_plan_op op;          /* the op about to run (ZD_OP_END: after the last) */
  uint32_t pass;          /* for ZD_OP_PASS / ZD_OP_PASS_GRAD: its number, 1.. */
  int64_t step;
  double lr;
  uint64_t tensors;
  const uint64_t* numel;  /* per tensor */
  const double* stats;    /* tensors x tensor_stats(): the last pass's, combined; NULL before the first pass */
  float* scalars;         /* tensors x tensor_scalars(), read and written */
} zd_tensor_step;

typedef struct zd_optimizer_v3 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_OPTIMIZER, abi_version 3 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;
  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);
  uint32_t (*state_slots)(const void* instance);
  const char* (*state_name)(const void* instance, uint32_t slot);
  int32_t (*supports_isa)(zd_isa isa);
  /* One pass of a step over a range of the owned shard (within one tensor
   * when the plan has an exchange or the plugin has tensor scalars or
   * statistics). Thread-safe on disjoint ranges. */
  zd_status (*update)(const void* instance, zd_isa isa, const zd_optimizer_update* u);
  zd_status (*update_cuda)(const void* instance, const zd_optimizer_update* u, void* stream);

  /* The step's plan (above). ZD_ERR_INVALID_ARGUMENT for a step < 1. */
  zd_status (*plan)(const void* instance, int64_t step, int32_t warmup, int32_t sync, zd_optimizer_plan* out);
  /* ZD_OP_PREPARE on a range of one tensor of the rank's local gradient:
   * u->grad, u->exchange (in and out); master, work and state are NULL.
   * Thread-safe on disjoint ranges. NULL when no plan prepares. */
  zd_status (*prepare)(const void* instance, zd_isa isa, const zd_optimizer_update* u);
  /* The state slot ZD_EXCHANGE_IN_SLOT gathers (for 1-bit Adam the momentum). */
  uint32_t (*average_slot)(const void* instance);
  /* Per-tensor scalars the host keeps and statistics a pass reports (0..16). */
  uint32_t (*tensor_scalars)(const void* instance);
  uint32_t (*tensor_stats)(const void* instance);
  zd_stat_op (*stat_op)(const void* instance, uint32_t stat);
  /* Between ops, once for all tensors (above); NULL when the plugin has
   * neither scalars nor statistics. */
  zd_status (*tensor_step)(const void* instance, const zd_tensor_step* s);
  /* ZD_OK when this configuration runs with the ZD_PARTITION_* bits given;
   * else ZD_ERR_CONFIG with the reason in err (naming the hyperparameter to
   * change, if one would do). */
  zd_status (*check_partitions)(const void* instance, uint32_t partitions, char* err, size_t err_size);
  /* 1 when some plan of this configuration exchanges or keeps gradients
   * local: the host then keeps error feedback (and at ZeRO stages 2-3 a
   * whole local gradient) per rank; 0 for a plain optimizer. */
  int32_t (*compresses)(const void* instance);
} zd_optimizer_v3;

/* Version 4: v3, then the dtype the host may keep the state slots in. The
 * first fields are v3's, in v3's order. A job's optimizer.state_dtype =
 * "bf16" keeps every state slot as bf16 (2 bytes per element instead of 4;
 * the fp32 master stays fp32): the host allocates, moves, offloads and
 * checkpoints the slots in that dtype (checkpoints hold fp32 values, so they
 * load into a job of either state dtype) and passes it in
 * zd_optimizer_update.state_dtype to update(), update_cuda() and prepare().
 * The host lifts v1, v2 and v3 plugins to this table with a
 * supports_state_dtype() that accepts fp32 alone, so such a plugin is
 * refused a bf16 state by name. */
typedef struct zd_optimizer_v4 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_OPTIMIZER, abi_version 4 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;
  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);
  uint32_t (*state_slots)(const void* instance);
  const char* (*state_name)(const void* instance, uint32_t slot);
  int32_t (*supports_isa)(zd_isa isa);
  zd_status (*update)(const void* instance, zd_isa isa, const zd_optimizer_update* u);
  zd_status (*update_cuda)(const void* instance, const zd_optimizer_update* u, void* stream);
  zd_status (*plan)(const void* instance, int64_t step, int32_t warmup, int32_t sync, zd_optimizer_plan* out);
  zd_status (*prepare)(const void* instance, zd_isa isa, const zd_optimizer_update* u);
  uint32_t (*average_slot)(const void* instance);
  uint32_t (*tensor_scalars)(const void* instance);
  uint32_t (*tensor_stats)(const void* instance);
  zd_stat_op (*stat_op)(const void* instance, uint32_t stat);
  zd_status (*tensor_step)(const void* instance, const zd_tensor_step* s);
  zd_status (*check_partitions)(const void* instance, uint32_t partitions, char* err, size_t err_size);
  int32_t (*compresses)(const void* instance);

  /* 1 when this configuration can keep its state slots in dtype (passed in
   * zd_optimizer_update.state_dtype) on every ISA it supports and, if it has
   * update_cuda, on CUDA; 0 otherwise. ZD_DTYPE_F32 must answer 1. */
  int32_t (*supports_state_dtype)(const void* instance, zd_dtype dtype);
} zd_optimizer_v4;

/* ------------------------------------------------------------------------ */
/* Communication plugins (kind ZD_PLUGIN_COMM, version 1)                    */
/* ------------------------------------------------------------------------ */
/* Collectives among the ranks of a job. Every rank calls each collective in
 * the same order with the same op, count, dtype and tag; the call blocks
 * until the collective is complete on this rank, fails, or times out. The
 * "local" plugin serves the ranks of one daemon: they are threads of one
 * process, and collectives run on those threads over shared memory.
 *
 * A rank that arrives at a collective different from the others' (another
 * tag, operation, reduce op, count, dtype or root) makes that collective
 * fail on every rank with ZD_ERR_INVALID_STATE; a collective that has not
 * started (not every rank arrived) after timeout_ms fails on every rank with
 * ZD_ERR_TIMEOUT. Once started, a collective runs to completion: its memory
 * work is bounded and its buffers must not be freed under it. last_error()
 * then says which rank was in which call (the `what` strings) and which had
 * not arrived. After any failure or abort the instance is broken for good:
 * every later call fails at once with that message; a job that continues
 * creates a new instance.
 *
 * Threads: each rank has at most one call in flight, from one thread at a
 * time; abort() may come from any thread. destroy() only when no call is in
 * flight. */

typedef int32_t zd_comm_dtype;
enum {
  ZD_COMM_F32 = 1,   /* = ZD_DTYPE_F32 */
  ZD_COMM_BF16 = 2,  /* = ZD_DTYPE_BF16 */
  ZD_COMM_F16 = 3,   /* = ZD_DTYPE_F16 */
  ZD_COMM_F64 = 64,  /* statistics (norms) */
  ZD_COMM_U8 = 65    /* bytes (packed bits): all_gather, all_to_all, broadcast; not reduced (v2) */
};

typedef int32_t zd_reduce_op;
enum { ZD_REDUCE_SUM = 1, ZD_REDUCE_MAX = 2 };

typedef struct zd_comm_call {
  uint32_t struct_size;
  int32_t rank;          /* the calling rank, 0..world_size-1 */
  uint64_t tag;          /* what the engine is doing; equal on every rank for the same collective */
  uint32_t timeout_ms;   /* 0 = no limit */
  uint32_t reserved;
  const char* what;      /* for messages, e.g. "backward_end('fc2'): reduce-scatter" */
} zd_comm_call;

typedef struct zd_comm_v1 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_COMM, abi_version 1 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;

  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      int32_t world_size, void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);

  /* buf: count elements on every rank, reduced in place; every rank ends
   * with the same values (summed in rank order, so bit-identical). */
  zd_status (*all_reduce)(void* instance, const zd_comm_call* call, void* buf, uint64_t count,
                          zd_comm_dtype dtype, zd_reduce_op op);
  /* send: world_size * recv_count elements; rank r receives the reduction of
   * chunk r of every rank's send. recv may be send + rank * recv_count. */
  zd_status (*reduce_scatter)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                              uint64_t recv_count, zd_comm_dtype dtype, zd_reduce_op op);
  /* recv: world_size * send_count elements, chunk k from rank k. send may be
   * recv + rank * send_count (in place). */
  zd_status (*all_gather)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                          uint64_t send_count, zd_comm_dtype dtype);
  zd_status (*broadcast)(void* instance, const zd_comm_call* call, void* buf, uint64_t count,
                         zd_comm_dtype dtype, int32_t root);
  zd_status (*barrier)(void* instance, const zd_comm_call* call);

  /* Makes every collective not yet started, and every later one, fail with
   * status and reason (a rank died, the job is stopping). Thread-safe. */
  void (*abort)(void* instance, zd_status status, const char* reason);
  /* The message of this rank's last failed call ("" if none); valid until
   * the rank's next call. */
  const char* (*last_error)(const void* instance, int32_t rank);
  /* Bytes this rank has sent to other ranks so far: what a ring algorithm
   * would put on a link (all-reduce 2(N-1)/N of the buffer, reduce-scatter
   * and all-gather (N-1) chunks). */
  uint64_t (*bytes_sent)(const void* instance, int32_t rank);
} zd_comm_v1;

/* Version 2: collectives across nodes (one daemon per node, each serving a
 * contiguous block of ranks), all-to-all, the 1-bit compressed average of
 * 1-bit Adam, and traffic figures. Not a prefix of v1: create() takes the
 * rank layout. */
typedef struct zd_comm_config {
  uint32_t struct_size;
  int32_t world_size;        /* ranks of the job, on every node */
  int32_t first_local_rank;  /* this daemon serves ranks [first_local_rank, */
  int32_t local_ranks;       /*   first_local_rank + local_ranks), node-major */
} zd_comm_config;

typedef struct zd_comm_v2 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_COMM, abi_version 2 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;

  /* A plugin that serves one node only refuses local_ranks < world_size
   * with a message that names the plugin to use instead. */
  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      const zd_comm_config* config, void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);

  /* As in v1; rank is a global rank served by this instance. */
  zd_status (*all_reduce)(void* instance, const zd_comm_call* call, void* buf, uint64_t count,
                          zd_comm_dtype dtype, zd_reduce_op op);
  zd_status (*reduce_scatter)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                              uint64_t recv_count, zd_comm_dtype dtype, zd_reduce_op op);
  zd_status (*all_gather)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                          uint64_t send_count, zd_comm_dtype dtype);
  zd_status (*broadcast)(void* instance, const zd_comm_call* call, void* buf, uint64_t count,
                         zd_comm_dtype dtype, int32_t root);
  zd_status (*barrier)(void* instance, const zd_comm_call* call);
  void (*abort)(void* instance, zd_status status, const char* reason);
  const char* (*last_error)(const void* instance, int32_t rank);

  /* send: world_size blocks of count elements, block k for rank k; recv:
   * world_size blocks of count elements, block k from rank k. Not in place:
   * send and recv must not overlap (other ranks read send while recv is
   * written). Any dtype, ZD_COMM_U8 included. */
  zd_status (*all_to_all)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                          uint64_t count, zd_comm_dtype dtype);

  /* 1-bit compressed average with error feedback (1-bit Adam), W ranks.
   * buf: count fp32 values of this rank in, their compressed average out
   * (the same on every rank). Chunks: c = count / W rounded up to a multiple
   * of 8; chunk r is elements [r c, min((r + 1) c, count)) (maybe short or
   * empty). worker_error: count values; server_error: c values (this rank's
   * chunk; those past its n_r real elements are neither read nor written);
   * both owned by the caller, zero at first, kept between calls. A call that
   * fails leaves buf and both error buffers as they were.
   *   worker: x = buf + worker_error; s = ||x||_2 / sqrt(count);
   *           worker_error = x - s sign(x)   (sign(0) = +1);
   *           chunk r of sign(x), packed 8 per byte, with s, goes to rank r.
   *   server (rank r, chunk r of n_r elements):
   *           y = (1/W) sum_k s_k sign_k + server_error;
   *           t = ||y||_2 / sqrt(n_r); server_error = y - t sign(y);
   *           sign(y) packed, with t, is gathered by every rank.
   *   result: chunk r of buf = t_r sign_r.
   * Bytes on the wire: the packed signs and one fp32 scale per chunk. */
  zd_status (*compressed_all_reduce)(void* instance, const zd_comm_call* call, float* buf, uint64_t count,
                                     float* worker_error, float* server_error);

  /* Traffic of a served rank so far (zd_comm_figures, zerod.h). */
  void (*figures)(const void* instance, int32_t rank, zd_comm_figures* out);
} zd_comm_v2;

/* Version 3: v2, then the memory an instance's collectives take. The host
 * hands a plugin that takes device memory the device pool's buffers as they
 * are, after the work that wrote them is done; every other collective on a
 * pool the host cannot address goes through host memory (a copy out, the
 * collective, a copy in). Calls still block until the results are in place:
 * a plugin that runs on a stream of its own waits for it before returning.
 * The fields up to figures are v2's, in v2's order. */
typedef uint32_t zd_comm_memory;
enum {
  ZD_COMM_MEMORY_HOST = 1u << 0, /* host memory: every plugin */
  ZD_COMM_MEMORY_CUDA = 1u << 1  /* device pointers of the calling rank's CUDA device (its pool) */
};

typedef struct zd_comm_v3 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_COMM, abi_version 3 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;

  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      const zd_comm_config* config, void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);
  zd_status (*all_reduce)(void* instance, const zd_comm_call* call, void* buf, uint64_t count,
                          zd_comm_dtype dtype, zd_reduce_op op);
  zd_status (*reduce_scatter)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                              uint64_t recv_count, zd_comm_dtype dtype, zd_reduce_op op);
  zd_status (*all_gather)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                          uint64_t send_count, zd_comm_dtype dtype);
  zd_status (*broadcast)(void* instance, const zd_comm_call* call, void* buf, uint64_t count,
                         zd_comm_dtype dtype, int32_t root);
  zd_status (*barrier)(void* instance, const zd_comm_call* call);
  void (*abort)(void* instance, zd_status status, const char* reason);
  const char* (*last_error)(const void* instance, int32_t rank);
  zd_status (*all_to_all)(void* instance, const zd_comm_call* call, const void* send, void* recv,
                          uint64_t count, zd_comm_dtype dtype);
  zd_status (*compressed_all_reduce)(void* instance, const zd_comm_call* call, float* buf, uint64_t count,
                                     float* worker_error, float* server_error);
  void (*figures)(const void* instance, int32_t rank, zd_comm_figures* out);

  /* ZD_COMM_MEMORY_* bits: where this instance's collectives may find their
   * buffers (send, recv, buf; compressed_all_reduce's are host memory
   * always). ZD_COMM_MEMORY_HOST is always set. A buffer of each call may be
   * in any memory the bits name, each classified on its own. */
  zd_comm_memory (*memory)(const void* instance);
} zd_comm_v3;

/* ------------------------------------------------------------------------ */
/* Partitioner plugins (kind ZD_PLUGIN_PARTITIONER, version 1)               */
/* ------------------------------------------------------------------------ */
/* A ZeRO stage: which state is split across ranks, how a tensor is cut into
 * shards, and the knobs of the gather / reduce / release schedule. The engine
 * moves the bytes; the partitioner decides the policy. */

enum {
  ZD_PARTITION_OPTIMIZER = 1u << 0, /* master and optimizer state: stage 1+ */
  ZD_PARTITION_GRADS = 1u << 1,     /* gradients, reduce-scattered during backward: stage 2+ */
  ZD_PARTITION_PARAMS = 1u << 2     /* working copies, gathered per module: stage 3 */
};

typedef struct zd_partitioner_v1 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_PARTITIONER, abi_version 1 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;

  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      int32_t world_size, void** out_instance, char* err, size_t err_size);
  void (*destroy)(void* instance);

  /* ZD_PARTITION_* bits. */
  uint32_t (*partitions)(const void* instance);
  /* The per-rank shard length of a tensor of numel elements, a multiple of
   * align and at least ceil(numel / world_size): rank r owns elements
   * [r * stride, (r + 1) * stride); past numel is zero padding. Stages 1-2
   * cut each parameter group's flat buffer this way, stage 3 each parameter
   * (align 1). */
  uint64_t (*shard_stride)(const void* instance, uint64_t numel, uint64_t align);
  /* Stage 3: parameters of at most this many elements stay gathered. */
  uint64_t (*persistence_threshold)(const void* instance);
  /* Gradients are reduced in buckets of about this many elements. */
  uint64_t (*bucket_elements)(const void* instance);
  /* Stage 3: gathered elements prefetching may hold at once, and may fetch
   * ahead of the module being begun (0 = no prefetch). */
  uint64_t (*max_live_elements)(const void* instance);
  uint64_t (*prefetch_elements)(const void* instance);
} zd_partitioner_v1;

/* ------------------------------------------------------------------------ */
/* Tier plugins (kind ZD_PLUGIN_TIER, version 1)                             */
/* ------------------------------------------------------------------------ */
/* Where state lives beyond the device pool: host RAM (memory the CPU uses
 * directly) or NVMe (storage read and written by offset). One instance per
 * rank. The engine decides what goes where (the job's placement policy) and
 * accounts every byte; the tier provides the memory or the storage.
 *
 * Status codes: a bad hyperparameter is ZD_ERR_CONFIG; a path or device
 * problem (missing, not writable, no O_DIRECT, disk full, a failed or short
 * transfer) ZD_ERR_IO; memory that cannot be had ZD_ERR_OUT_OF_MEMORY; a
 * malformed request (unaligned, outside the store, an unknown ticket)
 * ZD_ERR_INVALID_ARGUMENT. Messages name the path and, where given, the
 * tensor (reserve's `what`). */

enum {
  ZD_TIER_CAP_ADDRESSABLE = 1u << 0, /* allocate()/release(): memory */
  ZD_TIER_CAP_BLOCK = 1u << 1        /* reserve()/submit()/wait(): storage */
};

typedef struct zd_tier_config {
  uint32_t struct_size;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  /* Block tiers: the directories to keep the rank's store in (striped
   * across them). */
  const char* const* paths;
  int32_t path_count;
  int32_t reserved;
} zd_tier_config;

/* One transfer between memory and a block tier's store. offset, bytes and
 * buffer are multiples of alignment(). */
typedef struct zd_tier_io {
  uint64_t offset;     /* in the rank's store, from reserve() */
  uint64_t bytes;
  void* buffer;
  int32_t write;       /* 1: memory -> store, 0: store -> memory */
  int32_t reserved;
} zd_tier_io;

typedef struct zd_tier_v1 {
  zd_plugin_header header;  /* kind ZD_PLUGIN_TIER, abi_version 1 */
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;

  /* The instance for one rank. A block tier checks its paths here (they
   * exist, are writable, support O_DIRECT) and says which one failed why. */
  zd_status (*create)(const zd_host_services* host, const double* values, size_t value_count,
                      const zd_tier_config* config, void** out_instance, char* err, size_t err_size);
  /* Waits for the transfers still in flight, then frees the store (a block
   * tier's store does not outlive its instance). */
  void (*destroy)(void* instance);
  uint32_t (*capabilities)(const void* instance);
  /* A line for logs and `zerod plan`: "host: NUMA node 1 (cores 8-15), page-locked". */
  void (*describe)(const void* instance, char* out, size_t out_size);
  /* The CPUs the rank's optimizer threads should run on, nearest this
   * tier's memory: up to capacity OS cpu ids into cpus; returns how many
   * were written (0 = no preference). With cpus == NULL, returns how many
   * there are, so the caller can size its array. */
  int32_t (*cpus)(const void* instance, int32_t* cpus, int32_t capacity);

  /* Addressable tiers (NULL otherwise). Zero-filled, 64-byte aligned; NULL
   * with a message in err when the memory cannot be had. */
  void* (*allocate)(void* instance, uint64_t bytes, char* err, size_t err_size);
  void (*release)(void* instance, void* ptr, uint64_t bytes);

  /* Block tiers (NULL otherwise). */
  uint64_t (*alignment)(const void* instance);
  /* Reserves bytes of store, allocated on the device now so that a disk
   * that fills later cannot fail a write into it. what names the tensor for
   * messages. The store only grows: reservations last as long as the
   * instance. Transfers need offset, bytes and buffer to be multiples of
   * alignment() (one number for memory and store). */
  zd_status (*reserve)(void* instance, uint64_t bytes, const char* what, uint64_t* offset,
                       char* err, size_t err_size);
  /* Starts transfers; *ticket identifies them for wait(). Thread-safe. */
  zd_status (*submit)(void* instance, const zd_tier_io* ios, uint32_t count, uint64_t* ticket,
                      char* err, size_t err_size);
  /* Waits until a submit's transfers are done. Every completion is checked:
   * an error or a short transfer is reported naming the path and offset.
   * Each ticket is waited on once; a ticket never waited on is kept until
   * destroy. */
  zd_status (*wait)(void* instance, uint64_t ticket, char* err, size_t err_size);
} zd_tier_v1;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZEROD_ZEROD_PLUGIN_H */
