// Reader of the driver's binary input (format version 5). Strict: the magic, the version and
// the file size are checked against the header's counts before anything is read, and every id
// is range-checked, so a damaged or truncated file never turns into a silently different run.
#include "input.h"

#include <cstdio>
#include <cstring>
#include <memory>

namespace xsim {

namespace {

constexpr char MAGIC[8] = {'X', 'S', 'I', 'M', 'H', 'T', 'S', '\0'};
constexpr char END_MAGIC[8] = {'X', 'S', 'I', 'M', 'E', 'N', 'D', '\0'};
constexpr uint64_t NUM_COUNTS = 12;
constexpr uint64_t HEADER_BYTES = 8 + 4 + 4 + NUM_COUNTS * 8;

struct File {
    std::FILE* f = nullptr;
    ~File() {
        if (f) std::fclose(f);
    }
};

// Read `count` values of T (little-endian on disk; this driver targets little-endian hosts).
template <class T>
bool read_array(std::FILE* f, std::vector<T>& out, uint64_t count) {
    out.resize(count);
    return count == 0 || std::fread(out.data(), sizeof(T), count, f) == count;
}

// The what-if sections (after the successors): interval slowdowns (`SR` ranks, `S` segments,
// `K` stretched compute ops) and reroute epochs (`P` instants, `D` detours), all range-checked.
bool read_whatif(std::FILE* f, const uint64_t* c, Input& in, std::string& error) {
    const uint64_t SR = c[7], S = c[8], K = c[9], P = c[10], D = c[11];
    const uint64_t N = in.ops.size(), R = in.routes.size();
    WhatIf& w = in.whatif;
    std::vector<uint64_t> s_off, at, d_off;
    std::vector<double> lo, hi, factor;
    std::vector<uint32_t> k_op, d_op;
    std::vector<int32_t> k_rank, d_fwd, d_rev;
    bool ok = (SR == 0 || read_array(f, s_off, SR + 1)) && read_array(f, lo, S) &&
              read_array(f, hi, S) && read_array(f, factor, S) && read_array(f, k_op, K) &&
              read_array(f, k_rank, K) && read_array(f, at, P) &&
              (P == 0 || read_array(f, d_off, P + 1)) && read_array(f, d_op, D) &&
              read_array(f, d_fwd, D) && read_array(f, d_rev, D);
    if (!ok) {
        error = "cannot read the what-if sections the header announces (damaged file)";
        return false;
    }
    if (SR > 0) {
        if (s_off[0] != 0 || s_off[SR] != S) {
            error = "slowdowns: offsets must start at 0 and end at the segment count";
            return false;
        }
        w.slow_start.assign(s_off.begin(), s_off.end());
        for (uint64_t r = 0; r < SR; r++) {
            if (s_off[r + 1] < s_off[r]) {
                error = "slowdowns of rank " + std::to_string(r) + ": offsets must not decrease";
                return false;
            }
        }
        w.slow_seg.resize(S);
        for (uint64_t j = 0; j < S; j++) {
            SlowSegment g{lo[j], hi[j], factor[j]};
            if (!(g.factor > 0) || !(g.lo_ps >= 0) || (g.hi_ps >= 0 && g.hi_ps <= g.lo_ps)) {
                error = "slowdown segment " + std::to_string(j) +
                        ": needs factor > 0, lo >= 0 and hi > lo (or hi < 0: to the end)";
                return false;
            }
            w.slow_seg[j] = g;
        }
        w.slow_rank.assign(N, -1);
        for (uint64_t i = 0; i < K; i++) {
            if (k_op[i] >= N || k_rank[i] < 0 || (uint64_t)k_rank[i] >= SR ||
                in.ops[k_op[i]].kind != OP_COMPUTE) {
                error = "slowed op entry " + std::to_string(i) +
                        ": expected a compute op and a rank in range";
                return false;
            }
            w.slow_rank[k_op[i]] = k_rank[i];
        }
    } else if (S != 0 || K != 0) {
        error = "slowdown segments or ops without slowed ranks";
        return false;
    }
    if (P > 0 && (d_off[0] != 0 || d_off[P] != D)) {
        error = "reroutes: offsets must start at 0 and end at the detour count";
        return false;
    }
    if (P == 0 && D != 0) {
        error = "detours without reroute epochs";
        return false;
    }
    w.epochs.resize(P);
    for (uint64_t i = 0; i < P; i++) {
        RerouteEpoch& e = w.epochs[i];
        e.at_ps = at[i];
        if ((i && at[i] <= at[i - 1]) || d_off[i + 1] < d_off[i]) {
            error = "reroute epoch " + std::to_string(i) +
                    ": epochs must be in time order with non-decreasing offsets";
            return false;
        }
        for (uint64_t j = d_off[i]; j < d_off[i + 1]; j++) {
            Detour d{d_op[j], d_fwd[j], d_rev[j]};
            bool good = d.op < N && in.ops[d.op].kind == OP_FLOW && d.fwd >= -1 &&
                        d.rev >= -1 && d.fwd < (int64_t)R && d.rev < (int64_t)R &&
                        (e.detours.empty() || d.op > e.detours.back().op);
            if (!good) {
                error = "reroute epoch " + std::to_string(i) + ": bad detour " +
                        std::to_string(j - d_off[i]);
                return false;
            }
            e.detours.push_back(d);
        }
    }
    return true;
}

}  // namespace

bool read_input(const std::string& path, Input& in, std::string& error) {
    File file;
    file.f = std::fopen(path.c_str(), "rb");
    if (!file.f) {
        error = "cannot open input file " + path;
        return false;
    }
    std::FILE* f = file.f;
    char magic[8];
    uint32_t version_flags[2];
    uint64_t c[NUM_COUNTS];
    if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, MAGIC, 8) != 0) {
        error = "not an xsim-htsim input (it must start with the bytes 'XSIMHTS\\0'; a text"
                " file starting 'xsim-htsim 3' is the older format 3: rewrite the input with"
                " this checkout's xsim_htsim)";
        return false;
    }
    if (std::fread(version_flags, 4, 2, f) != 2) {
        error = "truncated header";
        return false;
    }
    if (version_flags[0] != INPUT_FORMAT_VERSION) {
        error = "input format version " + std::to_string(version_flags[0]) +
                " is not supported by this driver (it reads version " +
                std::to_string(INPUT_FORMAT_VERSION) +
                "); rebuild the driver or rewrite the input with this checkout's xsim_htsim";
        return false;
    }
    if (std::fread(c, 8, NUM_COUNTS, f) != NUM_COUNTS) {
        error = "truncated header";
        return false;
    }
    const uint64_t nodes = c[0], L = c[1], E = c[2], R = c[3], H = c[4], N = c[5], M = c[6];
    const uint64_t SR = c[7], S = c[8], K = c[9], P = c[10], D = c[11];
    if (N >= (uint64_t(1) << 31) || nodes >= (uint64_t(1) << 32) || L >= (uint64_t(1) << 32) ||
        SR >= (uint64_t(1) << 31) || S >= (uint64_t(1) << 40) || K > N || P >= (uint64_t(1) << 31) ||
        D >= (uint64_t(1) << 40)) {
        error = "header counts out of range (ops " + std::to_string(N) + ", links " +
                std::to_string(L) + ")";
        return false;
    }
    // Expected size from the counts (guarding against overflow with the limits above).
    const long double expect = (long double)HEADER_BYTES + L * (4 + 4 + 8 + 8 + 1) +
                               E * (8 + 4 + 8) + (R + 1) * 8 + H * 4 +
                               N * (1 + 8 + 8 + 4 + 4 + 4 + 4 + 1) + (N + 1) * 8 + M * 4 +
                               (SR ? (SR + 1) * 8 : 0) + S * (8 + 8 + 8) + K * (4 + 4) + P * 8 +
                               (P ? (P + 1) * 8 : 0) + D * (4 + 4 + 4) + 8;
    if (std::fseek(f, 0, SEEK_END) != 0) {
        error = "cannot seek in the input";
        return false;
    }
    const long size = std::ftell(f);
    if ((long double)size != expect) {
        error = "file is " + std::to_string(size) + " bytes, its header's counts need " +
                std::to_string((unsigned long long)expect) + " (truncated or damaged)";
        return false;
    }
    std::fseek(f, (long)HEADER_BYTES, SEEK_SET);
    in.num_nodes = (uint32_t)nodes;

    std::vector<uint32_t> lsrc, ldst, ev_link;
    std::vector<uint64_t> lbps, llat, ev_at, ev_bps, r_off, kvalue, klat, s_off;
    std::vector<uint8_t> lhost, kkind, ksu;
    std::vector<int32_t> ksrc, kdst, kfwd, krev;
    std::vector<uint32_t> r_links;
    bool ok = read_array(f, lsrc, L) && read_array(f, ldst, L) && read_array(f, lbps, L) &&
              read_array(f, llat, L) && read_array(f, lhost, L) && read_array(f, ev_at, E) &&
              read_array(f, ev_link, E) && read_array(f, ev_bps, E) &&
              read_array(f, r_off, R + 1) && read_array(f, r_links, H) &&
              read_array(f, kkind, N) && read_array(f, kvalue, N) && read_array(f, klat, N) &&
              read_array(f, ksrc, N) && read_array(f, kdst, N) && read_array(f, kfwd, N) &&
              read_array(f, krev, N) && read_array(f, ksu, N) &&
              read_array(f, s_off, N + 1) && read_array(f, in.succ, M);
    if (!ok) {
        error = "cannot read the sections the header announces (damaged file)";
        return false;
    }
    const long whatif_at = std::ftell(f);  // the what-if sections are read after the ops

    in.links.resize(L);
    for (uint64_t i = 0; i < L; i++) {
        LinkSpec& l = in.links[i];
        l = LinkSpec{lsrc[i], ldst[i], lbps[i], llat[i], lhost[i] != 0};
        if (l.src_node >= in.num_nodes || l.dst_node >= in.num_nodes) {
            error = "link " + std::to_string(i) + ": node id out of range";
            return false;
        }
        if (l.bps == 0) {
            error = "link " + std::to_string(i) +
                    " has zero capacity; htsim cannot build a queue that never drains";
            return false;
        }
    }
    in.events.resize(E);
    for (uint64_t i = 0; i < E; i++) {
        in.events[i] = EventSpec{ev_at[i], ev_link[i], ev_bps[i]};
        if (ev_link[i] >= L) {
            error = "event " + std::to_string(i) + ": link id out of range";
            return false;
        }
        if (i > 0 && ev_at[i] < ev_at[i - 1]) {
            error = "event " + std::to_string(i) + ": events must be in time order";
            return false;
        }
    }
    if (r_off[0] != 0 || r_off[R] != H) {
        error = "routes: offsets must start at 0 and end at the route link count";
        return false;
    }
    in.routes.resize(R);
    for (uint64_t r = 0; r < R; r++) {
        if (r_off[r + 1] < r_off[r]) {
            error = "route " + std::to_string(r) + ": offsets must not decrease";
            return false;
        }
        in.routes[r].assign(r_links.begin() + (long)r_off[r], r_links.begin() + (long)r_off[r + 1]);
        for (size_t j = 0; j < in.routes[r].size(); j++) {
            if (in.routes[r][j] >= L) {
                error = "route " + std::to_string(r) + ": bad link id at hop " + std::to_string(j);
                return false;
            }
        }
    }
    in.ops.resize(N);
    for (uint64_t i = 0; i < N; i++) {
        OpSpec& op = in.ops[i];
        op.kind = (OpKind)kkind[i];
        op.scale_up = ksu[i] != 0;
        op.value = kvalue[i];
        op.latency_ps = klat[i];
        op.src_rank = ksrc[i];
        op.dst_rank = kdst[i];
        op.fwd_route = kfwd[i];
        op.rev_route = krev[i];
        bool good = kkind[i] <= OP_BARRIER && ksu[i] <= 1;
        if (good && op.kind == OP_FLOW) {
            good = op.fwd_route < (int64_t)R && op.rev_route < (int64_t)R &&
                   op.fwd_route >= -1 && op.rev_route >= -1 &&
                   (op.fwd_route < 0) == (op.rev_route < 0);
        } else if (good) {
            good = op.latency_ps == 0 && !op.scale_up && op.fwd_route == -1 &&
                   op.rev_route == -1 && (op.kind == OP_COMPUTE || op.value == 0);
        }
        if (!good) {
            error = "op " + std::to_string(i) + ": bad kind, flags or route ids (kind " +
                    std::to_string(kkind[i]) + ", route " + std::to_string(kfwd[i]) + ")";
            return false;
        }
    }
    if (s_off[0] != 0 || s_off[N] != M) {
        error = "successors: offsets must start at 0 and end at the edge count";
        return false;
    }
    for (uint64_t i = 0; i < N; i++) {
        if (s_off[i + 1] < s_off[i]) {
            error = "successors of op " + std::to_string(i) + ": offsets must not decrease";
            return false;
        }
    }
    for (uint64_t e = 0; e < M; e++) {
        if (in.succ[e] >= N) {
            error = "successor " + std::to_string(e) + ": bad op id " + std::to_string(in.succ[e]);
            return false;
        }
    }
    in.succ_start.assign(s_off.begin(), s_off.end());
    std::fseek(f, whatif_at, SEEK_SET);
    if (!read_whatif(f, c, in, error)) return false;
    char end[8];
    if (std::fread(end, 1, 8, f) != 8 || std::memcmp(end, END_MAGIC, 8) != 0) {
        error = "no end marker after the sections (damaged file)";
        return false;
    }
    return true;
}

}  // namespace xsim
