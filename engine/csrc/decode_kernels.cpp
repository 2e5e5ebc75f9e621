// The lab's own CPU kernels for a decode step (engine/native.py builds this file): one-row matmuls over 4-bit and
// 8-bit weights with integer dot products and over fp32 and bf16 weights as plain streams, the step's largest
// groups of small ops fused (the norm, rotary + K/V write, single-query attention over the paged pool, silu * up;
// see below), and the helper threads they split rows over.
//
// Why: torch's CPU weight-only kernels widen every weight to float before multiplying: at one row they run at
// 8-18 GB/s here, so a q4 decode step was bound by arithmetic, not by the bytes it reads. Here, as in
// llama.cpp, the activation row is quantized per block of 32 (int8 with one float scale per block: xq = round(x
// / s), s = max|x| / 127) and each block's dot product with the weights' codes is an integer one (AVX512-VNNI's
// vpdpbusd, or AVX2's vpmaddubsw + vpmaddwd), computed for 16 output rows at once: the weights are regrouped at
// load time so that one instruction adds four products to each of 16 rows' sums (see q4_group).
//
//   q4:   w = d * code + m per block of 32 (GGUF Q4_1: fp16 d and m, codes 0..15). The weights are the file's
//         own, exactly: the same codes, d and m, 20 bytes per 32 weights, in groups of 16 rows.
//         y = sum over blocks of d * s * (codes . xq) + m * sum(x)
//   int8: w = scale_row * code (codes -127..127, bf16 row scales: torch's int8 kernel's own values).
//         y = scale_row * sum over blocks of s * (codes . xq)
//
// Only the activations are rounded (to ~1/254 of their block's largest value, about bf16's precision, which
// torch's kernels round them to). Every output row is computed by one thread in one order, so results do not
// depend on the thread count or on the other rows of the batch.
//
// Every op checks its inputs' types, shapes and slots and raises (a Python RuntimeError) rather than read
// outside a tensor.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::get_num_threads
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <utility>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define INFERLAB_AVX2 1
#endif
#if defined(INFERLAB_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define INFERLAB_VNNI 1  // 512-bit registers: two blocks per instruction
#endif

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kGrain = 64;  // output rows per task at the least: small matrices stay on one thread

inline float half_to_float(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The activation rows, quantized per block of 32.
struct Quantized {
  int64_t K, G;
  std::vector<int8_t> q;      // [M, K] xq = round(x / s)
  std::vector<float> s;       // [M, G] the blocks' scales
  std::vector<float> sum;     // [M, G] the blocks' float sums (q4's m term)
  std::vector<int32_t> qsum;  // [M, G] the blocks' sums of xq (int8's offset codes)
};

// The calling thread's buffers, overwritten by its next call (a decode step quantizes ~120 activation rows: its
// own vectors each time were ~500 allocations a step). A matmul holds one until it returns.
const Quantized& quantize(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / kBlock;
  thread_local Quantized out;
  out.K = K;
  out.G = G;
  out.q.resize(M * K);
  out.s.resize(M * G);
  out.sum.resize(M * G);
  out.qsum.resize(M * G);
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xb = x + r * K + g * kBlock;
      int8_t* q = out.q.data() + r * K + g * kBlock;
      float s, sum;
      int32_t qsum;
#ifdef INFERLAB_VNNI
      const __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      sum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
      s = amax / 127.f;
      const __m512 inv = _mm512_set1_ps(s > 0.f ? 1.f / s : 0.f);
      // round to nearest even, as nearbyint below (the default rounding mode)
      const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(qb));
      qsum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
#else
      float amax = 0.f;
      sum = 0.f;
      for (int64_t j = 0; j < kBlock; ++j) {
        amax = std::fmax(amax, std::fabs(xb[j]));
        sum += xb[j];
      }
      s = amax / 127.f;
      const float inv = s > 0.f ? 1.f / s : 0.f;
      qsum = 0;
      for (int64_t j = 0; j < kBlock; ++j) {
        q[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
        qsum += q[j];
      }
#endif
      out.s[r * G + g] = s;
      out.sum[r * G + g] = sum;
      out.qsum[r * G + g] = qsum;
    }
  }
  return out;
}

#ifdef INFERLAB_AVX2
// 8 int32 partial sums of a . b for 32 unsigned bytes a and 32 signed bytes b
inline __m256i dot_u8_i8(__m256i a, __m256i b) {
#ifdef INFERLAB_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#endif

#ifdef INFERLAB_VNNI
// the first `left` of 16 lanes (all 16 when left >= 16)
inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }
#endif

// The cache lines of the n bytes from p, requested ahead of use (prefetches never fault, also past the end). The
// compiler's builtin, not _mm_prefetch: this also builds where the vector paths are not compiled. Locality:
// kToL1 = prefetcht0, kToL2 = prefetcht1, kNonTemporal = prefetchnta.
constexpr int kNonTemporal = 0, kToL2 = 2, kToL1 = 3;
template <int kLocality>
inline void prefetch(const void* p, int64_t n) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(c + off, 0, kLocality);
}

// ---- q4, sixteen rows at a time -------------------------------------------------------------------------------
// The layout (engine/native.py's q4_rows builds it from the file's codes, d and m, losslessly): output rows in
// groups of 16; for each group and each block g of 32 columns, 320 bytes:
//   codes: 4 x 64 bytes; byte (v, i, t) = code[i][4v + t] | code[i][16 + 4v + t] << 4   (v, t < 4; row i < 16)
//   d: 16 fp16, then m: 16 fp16 (row i's d and m for block g)
// So a 64-byte load holds four consecutive codes of each of the 16 rows in each 32-bit lane (low nibbles) and
// four more (high nibbles): one vpdpbusd against four activation bytes broadcast to every lane adds four
// products to each row's sum. Sixteen rows come out in one register: no horizontal sums, and the activations'
// scales are applied once per block for 16 rows (the one-row-at-a-time form spent about half its instructions
// on that bookkeeping, and was bound by its arithmetic even when the weights came from memory).
constexpr int64_t kGroupRows = 16, kQ4GroupBlock = 320;
// q4's arithmetic per byte is ~3x int8's: with the weights coming from memory the core's own loads then ran only
// ~2 KB ahead of it. Prefetching 8 KB ahead (26 blocks) took 30 layers' q4 matrices from 24-29 to 26-34 GB/s
// here (1 and 2 threads, interleaved in one process; 5-20 KB measured, 8-13 best). Non-temporal: the weights,
// read once a step, then displace less of what the step's other work keeps in the caches (steps alternating in
// one process: 2-5 % faster q4 steps than with the plain hint; int8's prefetch likewise, 2-3 %).
constexpr int64_t kQ4Prefetch = 26 * kQ4GroupBlock;

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 16 outputs of one group of rows (its bytes w) for activation row r:
//   y[i] = sum over blocks g of d[g][i] * s[g] * (codes[i] . xq)_g + m[g][i] * sum(x)_g
void q4_group(const uint8_t* w, const Quantized& a, int64_t r, float* y) {
  const int64_t G = a.G;
  const int8_t* xq = a.q.data() + r * a.K;
  const float *s = a.s.data() + r * G, *xsum = a.sum.data() + r * G;
#ifdef INFERLAB_VNNI
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g, w += kQ4GroupBlock) {
    for (int l = 0; l < 5; ++l)  // the block 8 KB ahead (prefetches never fault, also past the end)
      _mm_prefetch(reinterpret_cast<const char*>(w + kQ4Prefetch + 64 * l), _MM_HINT_NTA);
    const int8_t* xb = xq + g * kBlock;
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i raw = _mm512_loadu_si512(w + 64 * v);
      lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(raw, low4), _mm512_set1_epi32(load_i32(xb + 4 * v)));
      hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4),
                               _mm512_set1_epi32(load_i32(xb + 16 + 4 * v)));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 256)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 288)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(d, _mm512_set1_ps(s[g])), acc);
    accm = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[g]), accm);
  }
  _mm512_storeu_ps(y, _mm512_add_ps(acc, accm));
#elif defined(INFERLAB_AVX2)
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int half = 0; half < 2; ++half) {  // rows 0-7, then 8-15: the second 32 bytes of each 64
    const uint8_t* wb = w + 32 * half;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g, wb += kQ4GroupBlock) {
      const int8_t* xb = xq + g * kBlock;
      __m256i dot = _mm256_setzero_si256();
      for (int v = 0; v < 4; ++v) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * v));
        dot = _mm256_add_epi32(dot, dot_u8_i8(_mm256_and_si256(raw, low4), _mm256_set1_epi32(load_i32(xb + 4 * v))));
        dot = _mm256_add_epi32(dot, dot_u8_i8(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
                                              _mm256_set1_epi32(load_i32(xb + 16 + 4 * v))));
      }
      const uint8_t* dm = wb - 32 * half + 256 + 16 * half;
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm + 32)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(s[g])), acc);
      accm = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum[g]), accm);
    }
    _mm256_storeu_ps(y + 8 * half, _mm256_add_ps(acc, accm));
  }
#else
  for (int64_t i = 0; i < kGroupRows; ++i) {
    float acc = 0.f, accm = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* wb = w + g * kQ4GroupBlock;
      const int8_t* xb = xq + g * kBlock;
      int32_t dot = 0;
      for (int64_t v = 0; v < 4; ++v)
        for (int64_t t = 0; t < 4; ++t) {
          const uint8_t byte = wb[64 * v + 4 * i + t];
          dot += (byte & 0x0F) * xb[4 * v + t] + (byte >> 4) * xb[16 + 4 * v + t];
        }
      uint16_t d, m;
      std::memcpy(&d, wb + 256 + 2 * i, 2);
      std::memcpy(&m, wb + 288 + 2 * i, 2);
      acc += half_to_float(d) * s[g] * static_cast<float>(dot);
      accm += half_to_float(m) * xsum[g];
    }
    y[i] = acc + accm;
  }
#endif
}

// ---- int8, sixteen rows at a time ------------------------------------------------------------------------------
// The layout (engine/native.py's i8_rows, from torch's int8 tensors: the same codes and bf16 row scales): output
// rows in groups of 16; per group, for each block g of 32 columns 8 x 64 bytes, byte (v, i, t) = code[i][4v + t]
// + 128 (row i's code as an unsigned byte: vpdpbusd multiplies unsigned by signed bytes), then the group's 16 row
// scales (bf16). sum (code + 128) * xq = sum code * xq + 128 * sum xq: the second term is the activations' own,
// subtracted once per block.
constexpr int64_t kI8GroupBlock = 512, kI8Prefetch = 16 * kI8GroupBlock;

// The 16 outputs of one group of rows (its bytes w, G blocks) for activation row r:
//   y[i] = scale[i] * sum over blocks g of s[g] * (codes[i] . xq)_g
void i8_group(const uint8_t* w, const Quantized& a, int64_t r, float* y) {
  const int64_t G = a.G;
  const int8_t* xq = a.q.data() + r * a.K;
  const float* s = a.s.data() + r * G;
  const int32_t* qsum = a.qsum.data() + r * G;
  const uint16_t* scale = reinterpret_cast<const uint16_t*>(w + G * kI8GroupBlock);
#ifdef INFERLAB_VNNI
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g, w += kI8GroupBlock) {
    for (int l = 0; l < 8; ++l)  // the block 8 KB ahead, non-temporal (see kQ4Prefetch)
      _mm_prefetch(reinterpret_cast<const char*>(w + kI8Prefetch + 64 * l), _MM_HINT_NTA);
    const int8_t* xb = xq + g * kBlock;
    __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();  // two chains of four
    for (int v = 0; v < 8; v += 2) {
      d0 = _mm512_dpbusd_epi32(d0, _mm512_loadu_si512(w + 64 * v), _mm512_set1_epi32(load_i32(xb + 4 * v)));
      d1 = _mm512_dpbusd_epi32(d1, _mm512_loadu_si512(w + 64 * v + 64), _mm512_set1_epi32(load_i32(xb + 4 * v + 4)));
    }
    const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(d0, d1), _mm512_set1_epi32(128 * qsum[g]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(s[g]), acc);
  }
  const __m512i sc = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale))), 16);
  _mm512_storeu_ps(y, _mm512_mul_ps(acc, _mm512_castsi512_ps(sc)));
#elif defined(INFERLAB_AVX2)
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int half = 0; half < 2; ++half) {  // rows 0-7, then 8-15: the second 32 bytes of each 64
    const uint8_t* wb = w + 32 * half;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g, wb += kI8GroupBlock) {
      const int8_t* xb = xq + g * kBlock;
      __m256i dot = _mm256_setzero_si256();
      for (int v = 0; v < 8; ++v) {
        // back to signed codes (|code| <= 127): |c| . (x with c's sign) = c . x without vpmaddubsw's saturation
        const __m256i c = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * v)), flip);
        const __m256i x = _mm256_set1_epi32(load_i32(xb + 4 * v));
        dot = _mm256_add_epi32(dot, dot_u8_i8(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c)));
      }
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s[g]), acc);
    }
    for (int64_t i = 0; i < 8; ++i) y[8 * half + i] = bf16_to_float(scale[8 * half + i]) * acc[i];
  }
#else
  for (int64_t i = 0; i < kGroupRows; ++i) {
    float acc = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* wb = w + g * kI8GroupBlock;
      int32_t dot = 0;
      for (int64_t v = 0; v < 8; ++v)
        for (int64_t t = 0; t < 4; ++t) dot += (int32_t{wb[64 * v + 4 * i + t]} - 128) * xq[g * kBlock + 4 * v + t];
      acc += s[g] * static_cast<float>(dot);
    }
    y[i] = bf16_to_float(scale[i]) * acc;
  }
#endif
}

// ---- the kernels' own helper threads ------------------------------------------------------------------------
// Why not OpenMP (at::parallel_for): the engine keeps OpenMP's waiting short (GOMP_SPINCOUNT=1000, so a step
// does not collapse when other processes share the cores: engine/openmp_env.py), and then each parallel region
// first wakes a sleeping thread: ~50 us here, 121 regions a q4 decode step, which made 2 threads slower than 1.
// These helpers wait for the next matmul for at most kSpin (a decode step's matmuls come ~20-40 us apart),
// yielding the core to anything else that wants it, and then sleep.
//
// And no barrier: a job is cut into chunks that the caller and the helpers claim one at a time, so when a
// helper has lost its core to another process the caller does the chunks itself instead of waiting a time
// slice for it (with fixed halves, two busy processes beside us made a 2-thread q4 step 18x the 1-thread one).
// The caller waits only for a chunk a helper has already begun. One chunk per thread: each chunk starts a new
// weight stream and costs a claim on a shared cache line, and with the q4 step's 120 matmuls four chunks per
// thread made the step 4-5 % slower than one (steps alternating in one process), two 1.5-3 %.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr int kChunksPerThread = 1;

class Pool {
 public:
  explicit Pool(int size) {
    for (int i = 1; i < size; ++i) threads_.emplace_back([this] { loop(); });
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // fn(chunk) for every chunk 0 .. chunks - 1, on this thread and on whichever helpers come; returns when all
  // have run
  void run(int chunks, const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> mine(busy_, std::try_to_lock);
    if (!mine.owns_lock()) {  // another thread is using the pool: run every chunk here instead
      for (int c = 0; c < chunks; ++c) fn(c);
      return;
    }
    job_.store(&fn, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t seq = (claim_.load(std::memory_order_relaxed) >> 32) + 1;
    claim_.store(seq << 32, std::memory_order_release);  // the job's number, and its next chunk: 0
    { std::lock_guard<std::mutex> lock(mutex_); }  // a helper between its check and its wait sees the new job
    wake_.notify_all();
    work(seq);
    while (done_.load(std::memory_order_acquire) < chunks) sched_yield();
  }

  // Byte ranges for a waiting helper to bring into its cache until the next job comes (the helper's share of the
  // next matrices, while this thread runs the small ops between matmuls). A hint: dropped if no helper waits.
  void bring_in(std::initializer_list<std::pair<const uint8_t*, int64_t>> ranges) {
    const uint64_t v = bg_seq_.load(std::memory_order_relaxed) + 1;
    bg_seq_.store(v | 1, std::memory_order_relaxed);  // odd: being written
    std::atomic_thread_fence(std::memory_order_release);
    int i = 0;
    for (const auto& r : ranges) if (i < 4) bg_[i++] = r;
    bg_count_ = i;
    bg_seq_.store((v | 1) + 1, std::memory_order_release);  // even: complete
  }

 private:
  void background(uint64_t& seen_bg, uint64_t job) {
    const uint64_t v = bg_seq_.load(std::memory_order_acquire);
    if (v == seen_bg || (v & 1)) return;
    std::pair<const uint8_t*, int64_t> r[4];
    const int n = bg_count_;
    for (int i = 0; i < n; ++i) r[i] = bg_[i];
    if (bg_seq_.load(std::memory_order_acquire) != v) return;  // rewritten meanwhile: next time
    seen_bg = v;
    for (int i = 0; i < n; ++i)
      for (int64_t off = 0; off < r[i].second; off += 4096) {  // 4 KB at a time, until a job comes
        if ((claim_.load(std::memory_order_acquire) >> 32) != job) return;
        prefetch<kToL2>(r[i].first + off, std::min<int64_t>(4096, r[i].second - off));
      }
  }

  // claim and run chunks of job `seq` until none is left (or a newer job has replaced it)
  void work(uint64_t seq) {
    uint64_t v = claim_.load(std::memory_order_acquire);
    while ((v >> 32) == seq && static_cast<int>(v & 0xFFFFFFFFu) < chunks_.load(std::memory_order_relaxed)) {
      if (claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) {
        // the job cannot end (and its fn go away) before this chunk is counted done
        (*job_.load(std::memory_order_relaxed))(static_cast<int>(v & 0xFFFFFFFFu));
        done_.fetch_add(1, std::memory_order_release);
        v = claim_.load(std::memory_order_acquire);
      }
    }
  }

  void loop() {
    uint64_t seen = 0, seen_bg = 0;
    auto posted = [&] { return (claim_.load(std::memory_order_acquire) >> 32) != seen; };
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      while (!posted()) {
        background(seen_bg, seen);
        if (std::chrono::steady_clock::now() - start > kSpin) {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait(lock, posted);
          break;
        }
        sched_yield();
      }
      seen = claim_.load(std::memory_order_acquire) >> 32;
      work(seen);
    }
  }

  std::vector<std::thread> threads_;
  std::atomic<uint64_t> claim_{0};  // (job number << 32) | next unclaimed chunk
  std::atomic<int> done_{0};
  std::atomic<const std::function<void(int)>*> job_{nullptr};
  std::atomic<int> chunks_{0};
  std::mutex mutex_, busy_;
  std::condition_variable wake_;
  std::atomic<uint64_t> bg_seq_{0};
  std::pair<const uint8_t*, int64_t> bg_[4];
  int bg_count_ = 0;
};

// One pool per thread count in a process (the governor moves between 1 and the configured count); a forked
// child starts its own, as threads do not survive a fork (the parent's pools are left as they are). Forks are
// counted by an atfork handler: asking getpid() here was a system call per matmul, ~120 a step.
std::atomic<int> forks{0};

Pool* pool_of(int threads) {
  static std::map<int, Pool*> pools;
  static int seen_forks = 0;
  static std::mutex guard;
  static const int registered = pthread_atfork(nullptr, nullptr, [] { forks.fetch_add(1); });
  (void)registered;
  std::lock_guard<std::mutex> lock(guard);
  if (seen_forks != forks.load(std::memory_order_relaxed)) {
    pools.clear();
    seen_forks = forks.load(std::memory_order_relaxed);
  }
  Pool*& pool = pools[threads];
  if (pool == nullptr) pool = new Pool(threads);
  return pool;
}

// Rows [0, n) in chunks of at least `grain` rows, over the calling thread's torch thread count (on the compute
// thread: the thread governor's choice).
// The rows of each chunk parallel_rows cuts [0, n) into at `threads` threads (n: one chunk, on the caller).
int64_t chunk_rows(int64_t n, int threads, int64_t grain) {
  if (threads <= 1 || n < 2 * grain) return n;
  const int64_t chunks = std::min<int64_t>(threads * kChunksPerThread, n / grain);
  return (n + chunks - 1) / chunks;
}

void parallel_rows(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t grain = kGrain) {
  const int threads = at::get_num_threads();
  const int64_t step = chunk_rows(n, threads, grain);
  if (step >= n) return body(0, n);
  const int64_t chunks = (n + step - 1) / step;
  pool_of(threads)->run(static_cast<int>(chunks), [&](int c) {
    const int64_t lo = c * step, hi = std::min(n, lo + step);
    if (lo < hi) body(lo, hi);
  });
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be float32 [M, K] on CPU");
  TORCH_CHECK(x.size(1) == K && K % kBlock == 0, "x has ", x.size(1), " columns; the weights have ", K,
              " (a multiple of 32)");
}

// x [M, K] float32; rows uint8 [N, 5K/8]: groups of 16 output rows, each group's Q4_1 codes, d and m values block
// by block (see q4_group; 20 bytes per 32 weights, as in the GGUF) -> [M, N]. A group's bytes lie together: the
// weights are read as one stream.
at::Tensor q4_linear(const at::Tensor& x_in, const at::Tensor& rows) {
  TORCH_CHECK(rows.scalar_type() == at::kByte && rows.dim() == 2 && rows.is_contiguous() && rows.size(1) % 20 == 0 &&
              rows.size(0) % kGroupRows == 0,
              "rows: uint8 [N, 20 bytes per block of 32 weights], N a multiple of 16 (engine/native.py q4_rows)");
  const int64_t N = rows.size(0), R = rows.size(1), G = R / 20, K = G * kBlock;
  const at::Tensor x = x_in.contiguous();
  check_x(x, K);
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const Quantized& a = quantize(x.data_ptr<float>(), M, K);
  const uint8_t* wp = rows.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  parallel_rows(N / kGroupRows, [&](int64_t g0, int64_t g1) {
    for (int64_t grp = g0; grp < g1; ++grp)
      for (int64_t r = 0; r < M; ++r) q4_group(wp + grp * kGroupRows * R, a, r, yp + r * N + grp * kGroupRows);
  }, kGrain / kGroupRows);
  return y;
}

// x [M, K] float32; rows uint8 [N, K + 2]: groups of 16 output rows, each group's offset codes block by block, then
// its row scales (see i8_group; the bytes of torch's int8 codes and bf16 scales) -> [M, N]
at::Tensor i8_linear(const at::Tensor& x_in, const at::Tensor& rows) {
  TORCH_CHECK(rows.scalar_type() == at::kByte && rows.dim() == 2 && rows.is_contiguous() && rows.size(1) >= 2 &&
              (rows.size(1) - 2) % kBlock == 0 && rows.size(0) % kGroupRows == 0,
              "rows: uint8 [N, K + 2], K a multiple of 32, N of 16 (engine/native.py i8_rows)");
  const int64_t N = rows.size(0), R = rows.size(1), K = R - 2;
  const at::Tensor x = x_in.contiguous();
  check_x(x, K);
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const Quantized& a = quantize(x.data_ptr<float>(), M, K);
  const uint8_t* wp = rows.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  parallel_rows(N / kGroupRows, [&](int64_t g0, int64_t g1) {
    for (int64_t grp = g0; grp < g1; ++grp)
      for (int64_t r = 0; r < M; ++r) i8_group(wp + grp * kGroupRows * R, a, r, yp + r * N + grp * kGroupRows);
  }, kGrain / kGroupRows);
  return y;
}

// ---- one-row matmuls over float weights (fp32, bf16) ----------------------------------------------------------
// At one row, MKL's fp32 gemv and oneDNN's bf16 kernel read the weights at 7-13 GB/s here, a third of the memory's
// speed (issue 14). These read each weight row as one stream against the activation row (which stays in L1), one
// fused multiply-add per 16 weights: bound by the bytes. bf16 weights are widened exactly (a bf16 is a float's
// upper half), and the activations stay float32 (torch's bf16 kernels round them to bf16 too).
inline float widen(float w) { return w; }
inline float widen(uint16_t w) { return bf16_to_float(w); }

#ifdef INFERLAB_VNNI
// y = row w . x, 64 columns a step in four independent sums, the last steps masked. One row at a time: on this
// machine one weight stream per core read at 20 GB/s, and four rows side by side at 12 (the prefetchers follow
// one stream best).
inline float dense_dot(const float* w, int64_t K, const float* x) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16 * i), _mm512_loadu_ps(x + k + 16 * i), acc[i]);
  for (; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    acc[0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_maskz_loadu_ps(m, x + k), acc[0]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// bf16: 32 weights as 16 int32 lanes, each holding an even-numbered weight in its low half and the next one in its
// high half. A float's upper half is a bf16, so a shift gives the even weights and a mask the odd ones, exactly,
// with no shuffle; they meet the activations split the same way (xe: x[0], x[2], ..; xo: x[1], x[3], ..).
inline float bf16_dot(const uint16_t* w, int64_t K, const float* xe, const float* xo) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
      const __m512i v = _mm512_loadu_si512(w + k + 32 * i);
      const int64_t h = k / 2 + 16 * i;
      acc[2 * i] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_loadu_ps(xe + h), acc[2 * i]);
      acc[2 * i + 1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, high)), _mm512_loadu_ps(xo + h),
                                       acc[2 * i + 1]);
    }
  for (; k < K; k += 32) {  // the last weights, masked (an odd K's last lane has no odd weight: xo is 0 there)
    const int64_t left = K - k;
    const __mmask32 kw = left >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1ull << left) - 1);
    const __mmask16 kx = tail_mask((left + 1) / 2);
    const __m512i v = _mm512_maskz_loadu_epi16(kw, w + k);
    acc[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_maskz_loadu_ps(kx, xe + k / 2), acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, high)), _mm512_maskz_loadu_ps(kx, xo + k / 2), acc[1]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}
#else
template <typename T>
inline float dense_dot(const T* w, int64_t K, const float* x) {
  float part[8] = {0.f};  // eight running sums, which the compiler can keep in one vector register
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; ++j) part[j] += widen(w[k + j]) * x[k + j];
  for (; k < K; ++k) part[0] += widen(w[k]) * x[k];
  float total = 0.f;
  for (int j = 0; j < 8; ++j) total += part[j];
  return total;
}
#endif

// bf16 rows are prefetched ~8 KB ahead, non-temporally (as the q4 and int8 weights: read once a step): steps 4 %
// faster (alternating in one process); fp32's were not (its rows are twice as long: the core's own streams keep
// up), so only bf16 does.
constexpr int64_t kDensePrefetch = 8192;

// x [M, K] float32; w [N, K] of T -> [M, N]; every output by one thread in one order (batch- and thread-invariant)
template <typename T>
at::Tensor dense_linear(const at::Tensor& x_in, const T* wp, int64_t N, int64_t K) {
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu() && x.size(1) == K,
              "x must be float32 [M, K] on CPU with the weights' K = ", K, " columns");
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
#ifdef INFERLAB_VNNI
  if constexpr (std::is_same_v<T, uint16_t>) {  // bf16: the activations split into even and odd columns once
    const int64_t H = (K + 1) / 2;
    std::vector<float> xe(M * H, 0.f), xo(M * H, 0.f);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t k = 0; k < K; ++k) (k % 2 ? xo : xe)[r * H + k / 2] = xp[r * K + k];
    const int64_t ahead = std::max<int64_t>(1, kDensePrefetch / (K * 2));
    parallel_rows(N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        if (n + ahead < n1) prefetch<kNonTemporal>(wp + (n + ahead) * K, K * 2);
        for (int64_t r = 0; r < M; ++r) yp[r * N + n] = bf16_dot(wp + n * K, K, xe.data() + r * H, xo.data() + r * H);
      }
    });
    return y;
  } else
#endif
  {
    parallel_rows(N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t r = 0; r < M; ++r) yp[r * N + n] = dense_dot(wp + n * K, K, xp + r * K);
    });
    return y;
  }
}

// x [M, K] float32; w [N, K] float32 -> [M, N]
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous(), "w: contiguous float32 [N, K]");
  return dense_linear(x, w.data_ptr<float>(), w.size(0), w.size(1));
}

// x [M, K] float32; w [N, K] bfloat16 -> [M, N] (float32 arithmetic)
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous(), "w: contiguous bfloat16 [N, K]");
  return dense_linear(x, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), w.size(0), w.size(1));
}

// ---- the small ops of a decode step ---------------------------------------------------------------------------
// A decode step also runs ~1,000 small torch ops; each costs microseconds of dispatch, and on 2 threads some of
// them (the attention's batched matmuls) open a parallel region that first wakes a sleeping thread. These two
// replace the largest groups: the norm (F.rms_norm took ~10 us for 576 numbers) and single-query attention
// (gather K and V, two batched matmuls, a softmax: ~8 ops a layer).

#ifdef INFERLAB_VNNI
// e^x for 16 floats (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for e^r, then times 2^n;
// ~1 ulp). exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. The scalar loops it replaces called std::exp one
// number at a time: ~20 us of a step's silu over 1,536 numbers.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-104.f), x));  // (NaN: the 2nd operand)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// the sums of eight vectors' lanes: out[i] = sum of v[i]'s 16 lanes
inline __m256 hsum8(const __m512* v) {
  __m256 h[8];
  for (int i = 0; i < 8; ++i)  // low half + high half
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[i]), 1)));
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
  // s0123 = [h0..h3's sums of lanes 0-3 | the same of lanes 4-7]; likewise s4567
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float total = 0.f;
#if defined(INFERLAB_VNNI)
  __m512 acc = _mm512_setzero_ps();
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  total = _mm512_reduce_add_ps(acc);
#elif defined(INFERLAB_AVX2)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  total = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// x [M, H] float32, w [H] float32: x * rsqrt(mean(x^2) + eps) * w, row by row
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w, double eps) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x_in.dim() == 2 &&
              w.dim() == 1 && w.size(0) == x_in.size(1) && w.is_contiguous(), "rms_norm: float32 x [M, H] and w [H]");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), H = x.size(1);
  at::Tensor y = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < M; ++r) {
    const float* row = xp + r * H;
    const float inv = 1.f / std::sqrt(dot(row, row, H) / static_cast<float>(H) + static_cast<float>(eps));
    for (int64_t i = 0; i < H; ++i) yp[r * H + i] = row[i] * inv * wp[i];
  }
  return y;
}

// p[0..n) <- exp(p - top), top the largest p; returns top, and the sum of the exps in *sum
float exp_inplace(float* p, int64_t n, float* sum_out) {
  float top = -INFINITY, sum = 0.f;
#ifdef INFERLAB_VNNI
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < n; t += 16) {  // the tail's load masked too: p may end just before an unmapped page
    const __mmask16 m = tail_mask(n - t);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, p + t));
  }
  top = _mm512_reduce_max_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 m = tail_mask(n - t);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + t), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(p + t, m, e);
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  }
  sum = _mm512_reduce_add_ps(acc);
#else
  for (int64_t t = 0; t < n; ++t) top = std::fmax(top, p[t]);
  for (int64_t t = 0; t < n; ++t) sum += (p[t] = std::exp(p[t] - top));
#endif
  *sum_out = sum;
  return top;
}

// p[0..n) <- softmax(p)
void softmax_inplace(float* p, int64_t n) {
  float sum;
  exp_inplace(p, n, &sum);
  const float inv = 1.f / sum;
  for (int64_t t = 0; t < n; ++t) p[t] *= inv;
}

#ifdef INFERLAB_VNNI
// Scores of the keys [0, t) of one sequence for every head, t the largest multiple of 8 <= len (returned): eight
// keys at a time, their eight sums reduced together (one reduction per key cost more). The head size is a
// constant so that the eight sums stay in registers (with a variable one they went through memory on every
// multiply-add: the attention ran at a third of its speed).
template <int64_t kD>
int64_t key_scores(const float* q0, const float* kp, const int64_t* sb, int64_t len, int64_t H, int64_t group,
                   int64_t row, float sc, float* scores) {
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    const float* k[8];
    for (int j = 0; j < 8; ++j) k[j] = kp + sb[t + j] * row;
    for (int64_t j = t + 16; j < std::min(len, t + 24); ++j) prefetch<kToL1>(kp + sb[j] * row, row * 4);  // a KV block ends where the next may lie anywhere
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q0 + h * kD;
      const int64_t off = (h / group) * kD;
      __m512 acc[8];
      for (int j = 0; j < 8; ++j) {
        acc[j] = _mm512_setzero_ps();
        for (int64_t i = 0; i < kD; i += 16)
          acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + i), _mm512_loadu_ps(k[j] + off + i), acc[j]);
      }
      _mm256_storeu_ps(scores + h * len + t, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(sc)));
    }
  }
  return t;
}
#endif

// Attention of one query per head over n context tokens (slots sb[0..n)): scores, softmax, weighted sum of V.
// Every head at once: the K rows, then the V rows, are each read once, in context order. A block's slots are
// consecutive pool rows, so that is one contiguous stream per block (reading one head at a time touched a third
// of each row, three times over). stats == nullptr: o [H, D] = the normalised output. Else (a piece of a longer
// context): o = the sum of exp(score - max) * v, unnormalised, and stats [2H] = each head's max, then its sum.
void attend_range(const float* q0, const float* kp, const float* vp, const int64_t* sb, int64_t n, int64_t H,
                  int64_t group, int64_t D, int64_t row, float sc, float* o0, float* stats) {
  thread_local std::vector<float> scores;  // [H, n]
  scores.resize(H * n);
  float* sbuf = scores.data();
  int64_t t = 0;
#ifdef INFERLAB_VNNI
  if (D == 64) t = key_scores<64>(q0, kp, sb, n, H, group, row, sc, sbuf);
  else if (D == 128) t = key_scores<128>(q0, kp, sb, n, H, group, row, sc, sbuf);
#endif
  for (; t < n; ++t) {
    const float* k = kp + sb[t] * row;
    for (int64_t h = 0; h < H; ++h) sbuf[h * n + t] = dot(q0 + h * D, k + (h / group) * D, D) * sc;
  }
  for (int64_t h = 0; h < H; ++h) {
    if (stats == nullptr) {
      softmax_inplace(sbuf + h * n, n);
    } else {
      stats[h] = exp_inplace(sbuf + h * n, n, stats + H + h);
    }
  }
  std::fill(o0, o0 + H * D, 0.f);
  // o[h] = sum over t, in order, of p[h][t] * v[t][h's K/V head], kVChunk tokens at a time: their V rows come
  // into L1 for the first head and serve the rest from there
  constexpr int64_t kVChunk = 32;
  for (int64_t t0 = 0; t0 < n; t0 += kVChunk) {
    const int64_t t1 = std::min(n, t0 + kVChunk);
    for (int64_t u = t1; u < std::min(n, t1 + kVChunk); ++u) prefetch<kToL1>(vp + sb[u] * row, row * 4);
    for (int64_t h = 0; h < H; ++h) {
      const float* p = sbuf + h * n;
      const int64_t off = (h / group) * D;
      float* o = o0 + h * D;
      int64_t i = 0;
#ifdef INFERLAB_VNNI
      for (; i + 64 <= D; i += 64) {  // 64 output dims in four registers
        __m512 acc[4];
        for (int c = 0; c < 4; ++c) acc[c] = _mm512_loadu_ps(o + i + 16 * c);
        for (int64_t u = t0; u < t1; ++u) {
          const float* v = vp + sb[u] * row + off + i;
          const __m512 wt = _mm512_set1_ps(p[u]);
          for (int c = 0; c < 4; ++c) acc[c] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(v + 16 * c), acc[c]);
        }
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + i + 16 * c, acc[c]);
      }
#endif
      for (int64_t u = t0; u < t1; ++u) {
        const float* v = vp + sb[u] * row + off;
        for (int64_t j = i; j < D; ++j) o[j] += p[u] * v[j];
      }
    }
  }
}

// The pieces of one sequence's context (each [H, D] output share, then [H] maxima, [H] sums; see attend_range)
// into its output [H, D]: each piece weighed by e^(its max - the overall max), in order.
void merge_pieces(const float* part, int64_t pieces, int64_t H, int64_t D, float* out) {
  const int64_t stride = H * (D + 2);
  std::vector<float> w(pieces);
  for (int64_t h = 0; h < H; ++h) {
    float top = -INFINITY;
    for (int64_t i = 0; i < pieces; ++i) top = std::fmax(top, part[i * stride + H * D + h]);
    float sum = 0.f;
    for (int64_t i = 0; i < pieces; ++i) {
      w[i] = std::exp(part[i * stride + H * D + h] - top);
      sum += w[i] * part[i * stride + H * D + H + h];
    }
    float* o = out + h * D;
    std::fill(o, o + D, 0.f);
    for (int64_t i = 0; i < pieces; ++i) {
      const float* src = part + i * stride + h * D;
      for (int64_t j = 0; j < D; ++j) o[j] += w[i] * src[j];
    }
    const float inv = 1.f / sum;
    for (int64_t j = 0; j < D; ++j) o[j] *= inv;
  }
}

// One query per sequence, read straight from the paged pool: q [B, H, D]; k_pool, v_pool [S, KV, D]; slots
// [B, T] (each sequence's context slots, padded); lengths [B] (its context length <= T) -> [B, H, D].
// softmax(q . k * scale) over the context, then the weighted sum of v; the query heads of one K/V head share it.
// window > 0 (a sliding-window layer): over the context's last `window` tokens only (the query is the last).
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_pool, const at::Tensor& v_pool,
                            const at::Tensor& slots, const at::Tensor& lengths, double scale, int64_t window) {
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && q_in.dim() == 3, "decode_attention: q must be float32 [B, H, D]");
  TORCH_CHECK(k_pool.scalar_type() == at::kFloat && v_pool.scalar_type() == at::kFloat && k_pool.is_contiguous() &&
              v_pool.is_contiguous() && k_pool.dim() == 3 && k_pool.sizes() == v_pool.sizes(),
              "decode_attention: pools must be contiguous float32 [S, KV, D]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.is_contiguous() &&
              lengths.scalar_type() == at::kLong && lengths.numel() == slots.size(0), "decode_attention: slots/lengths");
  const at::Tensor q = q_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), S = k_pool.size(0), KV = k_pool.size(1), T = slots.size(1);
  TORCH_CHECK(B == slots.size(0) && D == k_pool.size(2) && KV > 0 && H % KV == 0, "decode_attention: shapes");
  TORCH_CHECK(window >= 0, "decode_attention: a negative window");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= T, "decode_attention: a length outside 1..", T);
    for (int64_t t = 0; t < lp[b]; ++t) TORCH_CHECK(sp[b * T + t] >= 0 && sp[b * T + t] < S, "decode_attention: slot");
  }
  at::Tensor out = at::empty_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k_pool.data_ptr<float>(), *vp = v_pool.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / KV, row = KV * D;  // row: one token's K (or V) for every head, contiguous in the pool
  const float sc = static_cast<float>(scale);
  // A context longer than kPiece is cut into pieces of kPiece tokens: each piece's softmax numerators, their sum
  // and its share of the output are computed alone (on any thread), then merged in order. The cut depends only
  // on the length: the result does not depend on the thread count or on the batch. One core alone read the
  // pool at ~5-7 GB/s (the K/V rows of a step are cold: the weights' stream has just passed), so a single
  // sequence's attention is shared too.
  constexpr int64_t kPiece = 32;
  // the keys sequence b's query sees: its context's slots [lo(b), lp[b]), len(b) of them
  auto lo = [&](int64_t b) { return window > 0 ? std::max<int64_t>(0, lp[b] - window) : int64_t{0}; };
  auto len = [&](int64_t b) { return lp[b] - lo(b); };
  std::vector<int64_t> first(B + 1, 0);  // sequence b's pieces: [first[b], first[b + 1])
  for (int64_t b = 0; b < B; ++b) first[b + 1] = first[b] + (len(b) > kPiece ? (len(b) + kPiece - 1) / kPiece : 1);
  const int64_t pieces = first[B];
  std::vector<float> part(pieces > B ? pieces * H * (D + 2) : 0);  // a cut piece's output share, max and sum
  auto piece = [&](int64_t b, int64_t i) {
    const int64_t n = len(b);
    const bool cut = n > kPiece;
    const int64_t t0 = cut ? (i - first[b]) * kPiece : 0, t1 = cut ? std::min(n, t0 + kPiece) : n;
    float* pp = cut ? part.data() + i * H * (D + 2) : nullptr;
    attend_range(qp + b * H * D, kp, vp, sp + b * T + lo(b) + t0, t1 - t0, H, group, D, row, sc,
                 cut ? pp : op + b * H * D, cut ? pp + H * D : nullptr);
  };
  const int64_t threads = at::get_num_threads();
  if (threads <= 1 || pieces < 2) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = first[b]; i < first[b + 1]; ++i) piece(b, i);
  } else {
    parallel_rows(pieces * kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo / kGrain; i < hi / kGrain; ++i)
        piece(std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1, i);
    });
  }
  for (int64_t b = 0; b < B; ++b)
    if (len(b) > kPiece) merge_pieces(part.data() + first[b] * H * (D + 2), first[b + 1] - first[b], H, D, op + b * H * D);
  return out;
}

// New tokens' rotary embedding and K/V write in one pass: qkv [N, (H + 2 KV) * D] (q, k, v of each new token),
// cos and sin [N, 1, D] (rotate-half convention, as the checkpoints use), slots [N]: the pool rows the tokens'
// K and V go to. Returns q [N, H, D] rotated; k is rotated on its way into k_pool, v copied into v_pool.
// q_norm and k_norm [D] given (Qwen3): each q and k head is first RMS-normalised with them, as rms_norm does a row.
at::Tensor rope_store(const at::Tensor& qkv_in, const at::Tensor& cos_in, const at::Tensor& sin_in, at::Tensor k_pool,
                      at::Tensor v_pool, const at::Tensor& slots, int64_t H, int64_t KV,
                      const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(k_pool.scalar_type() == at::kFloat && v_pool.scalar_type() == at::kFloat && k_pool.is_contiguous() &&
              v_pool.is_contiguous() && k_pool.dim() == 3 && k_pool.sizes() == v_pool.sizes() && k_pool.size(1) == KV,
              "rope_store: pools must be contiguous float32 [S, KV, D]");
  const int64_t S = k_pool.size(0), D = k_pool.size(2), half = D / 2;
  const at::Tensor qkv = qkv_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t N = qkv.size(0);
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.size(1) == (H + 2 * KV) * D && D % 2 == 0,
              "rope_store: qkv must be float32 [N, (heads + 2 kv_heads) * head_dim]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.numel() == N * D &&
              sin.numel() == N * D, "rope_store: cos and sin must be float32 [N, 1, D]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == N, "rope_store: one slot per new token");
  const at::Tensor sl = slots.contiguous();
  const int64_t* sp = sl.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(sp[n] >= 0 && sp[n] < S, "rope_store: a slot outside the pool");
  const bool normed = q_norm.has_value() && q_norm->defined();
  TORCH_CHECK(normed == (k_norm.has_value() && k_norm->defined()), "rope_store: q_norm and k_norm go together");
  if (normed)
    for (const at::Tensor* w : {&*q_norm, &*k_norm})
      TORCH_CHECK(w->scalar_type() == at::kFloat && w->dim() == 1 && w->size(0) == D && w->is_contiguous(),
                  "rope_store: q_norm and k_norm must be float32 [head_dim]");
  const float* qn = normed ? q_norm->data_ptr<float>() : nullptr;
  const float* kn = normed ? k_norm->data_ptr<float>() : nullptr;
  std::vector<float> head(normed ? D : 0);  // a head after its norm
  at::Tensor q = at::empty({N, H, D}, qkv.options());
  const float *xp = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *snp = sin.data_ptr<float>();
  float *qp = q.data_ptr<float>(), *kp = k_pool.data_ptr<float>(), *vp = v_pool.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const float *row = xp + n * (H + 2 * KV) * D, *c = cp + n * D, *s = snp + n * D;
    for (int64_t h = 0; h < H + KV; ++h) {  // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
      const float* x = row + h * D;
      if (normed) {
        const float* w = h < H ? qn : kn;
        const float inv = 1.f / std::sqrt(dot(x, x, D) / static_cast<float>(D) + static_cast<float>(eps));
        for (int64_t i = 0; i < D; ++i) head[i] = x[i] * inv * w[i];
        x = head.data();
      }
      float* y = h < H ? qp + (n * H + h) * D : kp + (sp[n] * KV + h - H) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        y[i] = a * c[i] + (-b) * s[i];
        y[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
    std::memcpy(vp + sp[n] * KV * D, row + (H + KV) * D, KV * D * sizeof(float));
  }
  return q;
}

// gu [N, 2I] (the fused gate and up projections) -> silu(gate) * up [N, I]
at::Tensor silu_mul(const at::Tensor& gu_in) {
  const at::Tensor gu = gu_in.contiguous();
  TORCH_CHECK(gu.scalar_type() == at::kFloat && gu.dim() == 2 && gu.size(1) % 2 == 0, "silu_mul: float32 [N, 2I]");
  const int64_t N = gu.size(0), I = gu.size(1) / 2;
  at::Tensor y = at::empty({N, I}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const float *gate = gp + n * 2 * I, *up = gate + I;
#ifdef INFERLAB_VNNI
    for (int64_t i = 0; i < I; i += 16) {
      const __mmask16 m = tail_mask(I - i);
      const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
      _mm512_mask_storeu_ps(yp + n * I + i, m,
                            _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)),
                                          _mm512_maskz_loadu_ps(m, up + i)));
    }
#else
    for (int64_t i = 0; i < I; ++i) yp[n * I + i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
#endif
  }
  return y;
}

// ---- one sequence's decode step, the whole layer stack -------------------------------------------------------
// The same ops in the same order as engine/scripted.py's `layers` (and so as Model.forward's Python path) for a
// single new token, the small ops and the lab's kernels called here directly: no TorchScript interpreter and no
// dispatcher between them (~300 calls a step; measured 4-8 % of a q4 or bf16 step). The results are the same
// bits (tests/test_engine_fastpath.py, tests/test_weights.py): the same kernels, and the residual and bias
// additions are the same elementwise float additions.
// engine/scripted.py's `matmul` for every kind but oneDNN's (whose op has no C++ entry here): the same ops with
// the same casts, so the same bits
at::Tensor step_linear(const at::Tensor& x, int64_t kind, const at::Tensor& w, const std::optional<at::Tensor>& aux,
                       const std::optional<at::Tensor>& bias_in) {
  const std::optional<at::Tensor> bias = bias_in.has_value() && bias_in->defined() ? bias_in : std::nullopt;
  at::Tensor y;
  switch (kind) {
    case 0: {  // MKL: F.linear, in the weight's dtype
      if (x.scalar_type() == w.scalar_type()) return at::linear(x, w, bias);
      y = at::linear(x.to(w.scalar_type()), w);
      break;
    }
    case 2:
      TORCH_CHECK(aux.has_value(), "decode_layers: int8 needs its row scales");
      y = at::_weight_int8pack_mm(x.to(at::kBFloat16), w, *aux);
      break;
    case 3:
      TORCH_CHECK(aux.has_value(), "decode_layers: int4 needs its scales and zeros");
      y = at::_weight_int4pack_mm_for_cpu(x.to(at::kBFloat16), w, 32, *aux);
      break;
    case 4: y = q4_linear(x, w); return bias ? y + *bias : y;
    case 5: y = i8_linear(x, w); return bias ? y + *bias : y;
    case 6: y = f32_linear(x, w); return bias ? y + *bias : y;
    case 7: y = bf16_linear(x, w); return bias ? y + *bias : y;
    default: TORCH_CHECK(false, "decode_layers: kernel kind ", kind, " is not run here");
  }
  y = y.to(x.scalar_type());  // torch's kernels: back from bf16, then the bias
  return bias ? y + *bias : y;
}

at::Tensor decode_layers(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& new_slots, at::TensorList k_pools, at::TensorList v_pools,
                         at::TensorList in_norm, at::TensorList post_norm, at::IntArrayRef kinds,
                         at::TensorList weights, const c10::List<std::optional<at::Tensor>>& aux,
                         const c10::List<std::optional<at::Tensor>>& biases, at::IntArrayRef dims, double eps,
                         double scale, const at::Tensor& slots, const at::Tensor& lengths, at::TensorList q_norm,
                         at::TensorList k_norm, at::IntArrayRef windows) {
  const int64_t L = static_cast<int64_t>(in_norm.size());
  TORCH_CHECK((q_norm.empty() || static_cast<int64_t>(q_norm.size()) == L) && q_norm.size() == k_norm.size() &&
              static_cast<int64_t>(windows.size()) == L,
              "decode_layers: per layer a window, and q and k norms for every layer or none");
  TORCH_CHECK(static_cast<int64_t>(post_norm.size()) == L && static_cast<int64_t>(k_pools.size()) == L &&
              static_cast<int64_t>(v_pools.size()) == L && static_cast<int64_t>(kinds.size()) == 4 * L &&
              static_cast<int64_t>(weights.size()) == 4 * L && static_cast<int64_t>(aux.size()) == 4 * L &&
              static_cast<int64_t>(biases.size()) == 4 * L && dims.size() >= 3,
              "decode_layers: per layer two norms, two pools and four matrices (kind, weight, aux, bias)");
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(0) == 1 && x_in.scalar_type() == at::kFloat,
              "decode_layers: one sequence's one new token, float32");
  const int64_t H = dims[0], KV = dims[1], D = dims[2];
  auto proj = [&](const at::Tensor& h, int64_t i) {
    return step_linear(h, kinds[i], weights[i], aux.get(i), biases.get(i));
  };
  // the residual stream: x + y as one loop into y, a fresh float32 [1, hidden] of the projection's: the same
  // elementwise float additions as torch's add, without its dispatch and iterator setup (~0.5-1 us warm, 60 a
  // step, more on the caches the weights have just flushed)
  auto residual = [](const at::Tensor& x, at::Tensor y) {
    TORCH_CHECK(y.scalar_type() == at::kFloat && y.is_contiguous() && y.sizes() == x.sizes(),
                "decode_layers: a projection's output does not match the residual stream");
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) yp[i] = xp[i] + yp[i];
    return y;
  };
  // While this thread runs the small ops between two matmuls (the norm, rotary, attention, silu), the memory
  // would idle: the waiting helper brings in its share of the next matrices instead (the second of the two
  // chunks parallel_rows cuts at two threads, which it then claims). Steps alternating in one process: q4 steps
  // 2-4 % faster, int8 ~1.5 %, bf16 ~2.5 %, fp32 ~1 %; bringing in this thread's share too was slower (it lands
  // in the helper's cache).
  const int threads = at::get_num_threads();
  auto share = [&](int64_t i) -> std::pair<const uint8_t*, int64_t> {
    if (i >= 4 * L || kinds[i] < 4) return {nullptr, 0};  // the lab's row kernels only (q4, int8, fp32, bf16)
    const at::Tensor& w = weights[i];
    // q4 and int8 split groups of 16 rows, fp32 and bf16 single rows (their parallel_rows calls)
    const int64_t unit = kinds[i] <= 5 ? kGroupRows : 1, units = w.size(0) / unit;
    const int64_t step = chunk_rows(units, 2, kGrain / unit), bytes = unit * w.size(1) * w.element_size();
    if (step >= units) return {nullptr, 0};  // one chunk: no helper
    return {static_cast<const uint8_t*>(w.data_ptr()) + step * bytes, (std::min(units, 2 * step) - step) * bytes};
  };
  auto hint = [&](int64_t i, int64_t j) {
    if (threads == 2) pool_of(threads)->bring_in({share(i), share(j)});
  };
  at::Tensor x = x_in.contiguous();
  for (int64_t li = 0; li < L; ++li) {
    const int64_t m = 4 * li;
    const at::Tensor qkv = proj(rms_norm(x, in_norm[li], eps), m);
    hint(m + 1, m + 2);
    const at::Tensor q = q_norm.empty()
        ? rope_store(qkv, cos, sin, k_pools[li], v_pools[li], new_slots, H, KV, std::nullopt, std::nullopt, eps)
        : rope_store(qkv, cos, sin, k_pools[li], v_pools[li], new_slots, H, KV, q_norm[li], k_norm[li], eps);
    const at::Tensor out = decode_attention(q, k_pools[li], v_pools[li], slots, lengths, scale, windows[li]);
    const at::Tensor o = proj(out.reshape({-1, H * D}), m + 1);
    hint(m + 2, m + 3);
    x = residual(x, o);
    const at::Tensor gu = proj(rms_norm(x, post_norm[li], eps), m + 2);
    hint(m + 3, m + 4);
    const at::Tensor d = proj(silu_mul(gu), m + 3);
    hint(m + 4, m + 5);
    x = residual(x, d);
  }
  return x;
}

// A model's plain decode step with all but the sequence's own inputs fixed: its weights, norms, rotary tables and
// head, and one cache's K/V pools, handed over once (engine/model.py's Model._plan_for) instead of at every step:
// as ~450 list elements per call they cost ~35 us warm and ~170 us on the caches the weights' stream has just
// flushed, ~6 % of a q4 step. Kept here under a number until drop_plan: a TorchScript object instead made every
// call raise and catch a C++ exception (the op's caller looks for __torch_function__ on each argument).
// decode_token writes the new token's K/V into the plan's pools, which its schema (an int) cannot declare: it is
// called eagerly only (Model._decode_native), never traced or compiled.
struct DecodePlan {
  std::vector<at::Tensor> k_pools, v_pools, in_norm, post_norm, weights, q_norm, k_norm;
  std::vector<int64_t> kinds, dims, windows;
  c10::List<std::optional<at::Tensor>> aux, biases;
  at::Tensor embed, cos, sin, final_norm, head_weight;
  std::optional<at::Tensor> head_aux, head_bias;
  int64_t head_kind = 0;
  double eps = 0, scale = 0;
};

std::mutex plans_mutex;
std::map<int64_t, std::shared_ptr<const DecodePlan>> plans;
int64_t plans_made = 0;

int64_t decode_plan(at::TensorList k_pools, at::TensorList v_pools, const at::Tensor& embed, const at::Tensor& cos,
                    const at::Tensor& sin, at::TensorList in_norm, at::TensorList post_norm, at::IntArrayRef kinds,
                    at::TensorList weights, const c10::List<std::optional<at::Tensor>>& aux,
                    const c10::List<std::optional<at::Tensor>>& biases, at::IntArrayRef dims, double eps, double scale,
                    const at::Tensor& final_norm, int64_t head_kind, const at::Tensor& head_weight,
                    const std::optional<at::Tensor>& head_aux, const std::optional<at::Tensor>& head_bias,
                    at::TensorList q_norm, at::TensorList k_norm, at::IntArrayRef windows) {
  const size_t L = in_norm.size();
  TORCH_CHECK(L > 0 && k_pools.size() == L && v_pools.size() == L && post_norm.size() == L && kinds.size() == 4 * L &&
              weights.size() == 4 * L && aux.size() == 4 * L && biases.size() == 4 * L,
              "decode_plan: per layer two pools, two norms and four matrices (kind, weight, aux, bias)");
  TORCH_CHECK((q_norm.empty() || q_norm.size() == L) && k_norm.size() == q_norm.size() && windows.size() == L,
              "decode_plan: per layer a window, and q and k norms for every layer or none");
  TORCH_CHECK(embed.dim() == 2 && cos.dim() == 2 && sin.dim() == 2, "decode_plan: embedding and rotary tables are 2-D");
  auto plan = std::make_shared<DecodePlan>();
  plan->k_pools = k_pools.vec();
  plan->v_pools = v_pools.vec();
  plan->in_norm = in_norm.vec();
  plan->post_norm = post_norm.vec();
  plan->weights = weights.vec();
  plan->kinds = kinds.vec();
  plan->q_norm = q_norm.vec();
  plan->k_norm = k_norm.vec();
  plan->windows = windows.vec();
  plan->dims = dims.vec();
  plan->aux = aux.copy();
  plan->biases = biases.copy();
  plan->embed = embed;
  plan->cos = cos;
  plan->sin = sin;
  plan->final_norm = final_norm;
  plan->head_weight = head_weight;
  plan->head_aux = head_aux;
  plan->head_bias = head_bias;
  plan->head_kind = head_kind;
  plan->eps = eps;
  plan->scale = scale;
  std::lock_guard<std::mutex> lock(plans_mutex);
  plans[++plans_made] = std::move(plan);
  return plans_made;
}

// Forget plan `id` (and let go of its tensors); an unknown id is ignored.
void drop_plan(int64_t id) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  plans.erase(id);
}

// One sequence's plain decode step, from its token to its logits in one call: the token's embedding row and its
// position's rotary row, decode_layers, the final norm and the head (float32 [1, vocab]). The same ops, in the
// same order, as the Python path (embedding and rotary views, decode_layers, rms_norm, the head's one-row
// kernel); without its dozen small torch calls between them, each tens of microseconds on the caches the
// weights' stream has just flushed (~0.2 ms of a ~4 ms q4 step). slots: the sequence's slots, at least pos + 1.
at::Tensor decode_token(int64_t plan, int64_t token, int64_t pos, const at::Tensor& slots) {
  std::shared_ptr<const DecodePlan> p;
  {
    std::lock_guard<std::mutex> lock(plans_mutex);
    const auto it = plans.find(plan);
    TORCH_CHECK(it != plans.end(), "decode_token: no decode plan ", plan);
    p = it->second;
  }
  TORCH_CHECK(token >= 0 && token < p->embed.size(0), "decode_token: token id outside the vocabulary");
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong && pos >= 0 && pos < slots.size(0) &&
              pos < p->cos.size(0) && pos < p->sin.size(0), "decode_token: a position without a slot or rotary row");
  const at::Tensor x = p->embed.narrow(0, token, 1);
  const at::Tensor cos = p->cos.narrow(0, pos, 1).unsqueeze(1), sin = p->sin.narrow(0, pos, 1).unsqueeze(1);
  const at::Tensor context = slots.narrow(0, 0, pos + 1).contiguous().view({1, pos + 1});
  const at::Tensor lengths = at::full({1}, pos + 1, slots.options());
  const at::Tensor h = decode_layers(x, cos, sin, slots.narrow(0, pos, 1), p->k_pools, p->v_pools, p->in_norm,
                                     p->post_norm, p->kinds, p->weights, p->aux, p->biases, p->dims, p->eps,
                                     p->scale, context, lengths, p->q_norm, p->k_norm, p->windows);
  return step_linear(rms_norm(h, p->final_norm, p->eps), p->head_kind, p->head_weight, p->head_aux, p->head_bias);
}

// nbytes of memory for weights that a decode step streams, 2 MB-aligned and advised for transparent huge pages
// (engine/native.py's pack). With 4 KB pages a step's ~100 MB of q4 weights span ~25,000 pages, each a TLB miss
// (a costly one in a VM); where the kernel gives no huge pages the advice is ignored and the pages are ordinary.
at::Tensor huge_buffer(int64_t nbytes) {
  TORCH_CHECK(nbytes > 0, "huge_buffer: nbytes must be positive");
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = (static_cast<size_t>(nbytes) + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, size) != 0) throw std::bad_alloc();
  madvise(p, size, MADV_HUGEPAGE);  // before the first touch: the pages are then allocated huge
  return at::from_blob(p, {nbytes}, [](void* q) { std::free(q); }, at::TensorOptions().dtype(at::kByte));
}

// (the first index of x's largest value, that value) for a float32 vector: greedy decoding's argmax (the lowest
// id among ties, as the sampling chain's), without torch's reduction machinery, which took ~0.1 ms a step on
// the caches the weights' stream had just flushed. A NaN anywhere gives (-1, NaN): the caller runs the chain.
std::tuple<int64_t, double> first_max(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 1 && x_in.numel() > 0 && x_in.device().is_cpu(),
              "first_max: a non-empty float32 vector on the CPU");
  const at::Tensor x = x_in.contiguous();
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  float top = -INFINITY;
  bool nan = false;
  int64_t i = 0;
#ifdef INFERLAB_VNNI
  __m512 mx = _mm512_set1_ps(-INFINITY);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(p + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    mx = _mm512_max_ps(mx, v);
  }
  nan = unordered != 0;
  top = _mm512_reduce_max_ps(mx);
#endif
  for (; i < n; ++i) {
    nan = nan || std::isnan(p[i]);
    top = std::fmax(top, p[i]);
  }
  if (nan) return {-1, NAN};
  for (i = 0; i < n; ++i)
    if (p[i] == top) break;
  return {i, top};
}

std::string isa() {
#if defined(INFERLAB_VNNI)
  return "avx512-vnni";
#elif defined(INFERLAB_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

// The ops' schemas are defined in Python (engine/native.py), so TorchScript can compile calls to them before
// this library is built; here are their CPU kernels.
TORCH_LIBRARY_IMPL(inferlab, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("i8_linear", &i8_linear);
  m.impl("f32_linear", &f32_linear);
  m.impl("bf16_linear", &bf16_linear);
  m.impl("rms_norm", &rms_norm);
  m.impl("decode_attention", &decode_attention);
  m.impl("rope_store", &rope_store);
  m.impl("silu_mul", &silu_mul);
  m.impl("decode_layers", &decode_layers);
}

TORCH_LIBRARY_FRAGMENT(inferlab_native, m) {
  m.def("isa() -> str", &isa);
  m.def("huge_buffer(int nbytes) -> Tensor", &huge_buffer);
  m.def("decode_plan(Tensor[] k_pools, Tensor[] v_pools, Tensor embed, Tensor cos, Tensor sin, Tensor[] in_norm, "
        "Tensor[] post_norm, int[] kinds, Tensor[] weights, Tensor?[] aux, Tensor?[] biases, int[] dims, float eps, "
        "float scale, Tensor final_norm, int head_kind, Tensor head_weight, Tensor? head_aux, Tensor? head_bias, "
        "Tensor[] q_norm, Tensor[] k_norm, int[] windows) -> int",
        &decode_plan);
  m.def("drop_plan(int plan) -> ()", &drop_plan);
  m.def("decode_token(int plan, int token, int pos, Tensor slots) -> Tensor", &decode_token);
  m.def("first_max(Tensor x) -> (int, float)", &first_max);
}
