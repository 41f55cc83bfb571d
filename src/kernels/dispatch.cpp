#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/log.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"
#include "kernels/x86/kernels_x86.h"

namespace mr {
namespace {

uint64_t Xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

struct CpuFlags {
  bool avx2 = false, fma = false, f16c = false, avx512 = false;
  bool avx512bf16 = false;  // AVX-512 (as above) and AVX512-BF16
  // AMX-TILE, AMX-INT8, AMX-BF16 and AVX512-BF16 with the tile state enabled by the OS (XCR0 bits
  // 17, 18)
  bool amx = false;
};

CpuFlags ReadCpuFlags() {
  CpuFlags f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & bit_OSXSAVE;
  const bool avx = c & bit_AVX;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = Xgetbv0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = ymm_state && (b & bit_AVX2);
  f.avx512 = zmm_state && (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) && (b & bit_AVX512DQ) &&
             (c & bit_AVX512VNNI);
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;  // cpuid 7.0 EDX
  constexpr unsigned kAvx512Bf16 = 1u << 5;                                          // cpuid 7.1 EAX
  const unsigned edx0 = d;
  unsigned a1 = 0, b1, c1, d1;
  f.avx512bf16 = f.avx512 && a >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & kAvx512Bf16);
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;
  f.amx = f.avx512bf16 && tile_state && (edx0 & kAmxTile) && (edx0 & kAmxInt8) && (edx0 & kAmxBf16);
  return f;
}

// cpuid leaf 0's vendor string is "GenuineIntel" (EBX, EDX, ECX).
bool IsIntel() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char v[13] = {};
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  return std::strcmp(v, "GenuineIntel") == 0;
}

const KernelTable kScalar = {
    CpuVariant::kScalar,
    &ref::QuantizeActs,
    &ref::MatmulQ8Tiles,
    &ref::MatmulQ8GluTiles,
    &ref::AttentionGqa,
    &ref::Glu,
    {&ref::MatmulKTiles, &ref::MatmulKTiles, &ref::MatmulKTiles, &ref::MatmulKTiles, &ref::MatmulKTiles,
     &ref::MatmulKTiles, &ref::MatmulKTiles, &ref::MatmulKTiles, &ref::MatmulKTiles, &ref::MatmulKTiles},
    {&ref::MatmulKGluTiles, &ref::MatmulKGluTiles, &ref::MatmulKGluTiles, &ref::MatmulKGluTiles, &ref::MatmulKGluTiles,
     &ref::MatmulKGluTiles, &ref::MatmulKGluTiles, &ref::MatmulKGluTiles, &ref::MatmulKGluTiles,
     &ref::MatmulKGluTiles}};
const KernelTable kAvx2 = {
    CpuVariant::kAvx2,
    &x86::QuantizeActsAvx2,
    &x86::MatmulQ8Avx2,
    &x86::MatmulQ8GluAvx2,
    &x86::AttentionGqaAvx2,
    &x86::GluAvx2,
    {&x86::MatmulQ4KAvx2, &x86::MatmulQ6KAvx2, &x86::MatmulQ50Avx2, &x86::MatmulQ41Avx2, &x86::MatmulQ80Avx2,
     &x86::MatmulQ40Avx2, &x86::MatmulQ5KAvx2, &x86::MatmulF16Avx2, &x86::MatmulBF16Avx2, &x86::MatmulMXFP4Avx2},
    {&x86::MatmulQ4KGluAvx2, &x86::MatmulQ6KGluAvx2, &x86::MatmulQ50GluAvx2, &x86::MatmulQ41GluAvx2,
     &x86::MatmulQ80GluAvx2, &x86::MatmulQ40GluAvx2, &x86::MatmulQ5KGluAvx2, &x86::MatmulF16GluAvx2,
     &x86::MatmulBF16GluAvx2, &x86::MatmulMXFP4GluAvx2}};
// AVX-512 machines have AVX2: activation quantization and the GLU are shared.
constexpr KernelTable kAvx512 = {
    CpuVariant::kAvx512,
    &x86::QuantizeActsAvx2,
    &x86::MatmulQ8Avx512,
    &x86::MatmulQ8GluAvx512,
    &x86::AttentionGqaAvx512,
    &x86::GluAvx2,
    {&x86::MatmulQ4KAvx512, &x86::MatmulQ6KAvx512, &x86::MatmulQ50Avx512, &x86::MatmulQ41Avx512, &x86::MatmulQ80Avx512,
     &x86::MatmulQ40Avx512, &x86::MatmulQ5KAvx512, &x86::MatmulF16Avx512, &x86::MatmulBF16Avx512,
     &x86::MatmulMXFP4Avx512},
    {&x86::MatmulQ4KGluAvx512, &x86::MatmulQ6KGluAvx512, &x86::MatmulQ50GluAvx512, &x86::MatmulQ41GluAvx512,
     &x86::MatmulQ80GluAvx512, &x86::MatmulQ40GluAvx512, &x86::MatmulQ5KGluAvx512, &x86::MatmulF16GluAvx512,
     &x86::MatmulBF16GluAvx512, &x86::MatmulMXFP4GluAvx512}};
// AVX-512 machines with AVX512-BF16: the AVX-512 table with attention on BF16 dot products
// (constexpr, so still constant-initialized).
constexpr KernelTable WithBf16Attention(KernelTable t, CpuVariant v, void (*attention)(const AttnChunk&, float*)) {
  t.variant = v;
  t.attention = attention;
  t.attention_bf16 = true;
  return t;
}
constexpr KernelTable WithPairCopies(KernelTable t) {
  t.kv_block_pairs = &x86::KvBlockPairsAvx512Bf16;
  return t;
}
constexpr KernelTable kAvx512Bf16 =
    WithPairCopies(WithBf16Attention(kAvx512, CpuVariant::kAvx512Bf16, &x86::AttentionGqaAvx512Bf16));
// AMX machines: the AVX-512 table with the many-row matmuls of Q4_K, Q6_K and the 32-input
// integer formats on AMX tiles (Q5_K, MXFP4 and the float formats stay on AVX-512: an MoE's
// MXFP4 experts see few rows each, below the 16 the tiles need), and attention on AMX-BF16. An
// aggregate like the others, so it is constant-initialized (no static-initialization order to
// depend on).
const KernelTable kAmx = {
    CpuVariant::kAmx,
    &x86::QuantizeActsAvx2,
    &x86::MatmulQ8Avx512,
    &x86::MatmulQ8GluAvx512,
    &x86::AttentionGqaAmx,
    &x86::GluAvx2,
    {&x86::MatmulQ4KAmx, &x86::MatmulQ6KAmx, &x86::MatmulQ50Amx, &x86::MatmulQ41Amx, &x86::MatmulQ80Amx,
     &x86::MatmulQ40Amx, &x86::MatmulQ5KAvx512, &x86::MatmulF16Avx512, &x86::MatmulBF16Avx512, &x86::MatmulMXFP4Avx512},
    {&x86::MatmulQ4KGluAmx, &x86::MatmulQ6KGluAmx, &x86::MatmulQ50GluAmx, &x86::MatmulQ41GluAmx, &x86::MatmulQ80GluAmx,
     &x86::MatmulQ40GluAmx, &x86::MatmulQ5KGluAvx512, &x86::MatmulF16GluAvx512, &x86::MatmulBF16GluAvx512,
     &x86::MatmulMXFP4GluAvx512},
    /*attention_bf16=*/true};

}  // namespace

const char* CpuVariantName(CpuVariant v) {
  switch (v) {
    case CpuVariant::kScalar:
      return "scalar";
    case CpuVariant::kAvx2:
      return "avx2";
    case CpuVariant::kAvx512:
      return "avx512";
    case CpuVariant::kAvx512Bf16:
      return "avx512bf16";
    case CpuVariant::kAmx:
      return "amx";
  }
  return "?";
}

bool CpuSupports(CpuVariant v) {
  static const CpuFlags f = ReadCpuFlags();
  switch (v) {
    case CpuVariant::kScalar:
      return true;
    case CpuVariant::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case CpuVariant::kAvx512:
      return f.avx512 && f.fma && f.f16c;
    case CpuVariant::kAvx512Bf16:
      return f.avx512bf16 && f.fma && f.f16c;
    case CpuVariant::kAmx:
      return f.amx && f.fma && f.f16c && x86::AmxPermitted();
  }
  return false;
}

// Dynamically initialized: a kernel that ran before it (none does: they run from main) would
// read 0, no prefetch.
const int64_t kernel_prefetch_bytes = IsIntel() ? 1024 : 0;

CpuVariant DetectCpuVariant() {
  if (CpuSupports(CpuVariant::kAmx)) return CpuVariant::kAmx;
  // vdpbf16ps zmm: about the FMA's instruction rate on Zen 4 (twice its multiply-adds), a quarter
  // of it on the Xeon of docs/performance.md stop 25; Intel CPUs with AVX512-BF16 but no AMX
  // (Cooper Lake) keep the FP32 attention.
  if (CpuSupports(CpuVariant::kAvx512Bf16) && !IsIntel()) return CpuVariant::kAvx512Bf16;
  if (CpuSupports(CpuVariant::kAvx512)) return CpuVariant::kAvx512;
  if (CpuSupports(CpuVariant::kAvx2)) return CpuVariant::kAvx2;
  return CpuVariant::kScalar;
}

namespace {
std::atomic<int> g_cpu_request{-1};  // a CpuVariant, or -1: none
}  // namespace

bool ParseCpuVariant(const std::string& name, CpuVariant* v) {
  for (CpuVariant c : kAllCpuVariants) {
    if (name == CpuVariantName(c)) {
      *v = c;
      return true;
    }
  }
  return false;
}

std::string CpuVariantNames() {
  std::string s;
  for (CpuVariant c : kAllCpuVariants) s += (s.empty() ? "" : ", ") + std::string(CpuVariantName(c));
  return s;
}

void RequestCpuVariant(std::optional<CpuVariant> v) {
  g_cpu_request.store(v ? static_cast<int>(*v) : -1);
}

CpuVariant SelectedCpuVariant() {
  const int req = g_cpu_request.load();
  if (req < 0) return DetectCpuVariant();
  const auto want = static_cast<CpuVariant>(req);
  if (!CpuSupports(want)) {
    MR_LOGW("cpu", "the %s kernels are not supported by this CPU; using %s", CpuVariantName(want),
            CpuVariantName(DetectCpuVariant()));
    return DetectCpuVariant();
  }
  return want;
}

const KernelTable& GetKernels(CpuVariant v) {
  switch (v) {
    case CpuVariant::kAmx:
      return kAmx;
    case CpuVariant::kAvx512Bf16:
      return kAvx512Bf16;
    case CpuVariant::kAvx512:
      return kAvx512;
    case CpuVariant::kAvx2:
      return kAvx2;
    case CpuVariant::kScalar:
      return kScalar;
  }
  return kScalar;
}

}  // namespace mr
