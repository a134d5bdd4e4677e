// Reader of the driver's binary input (format version 4). Strict: the magic, the version and
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
constexpr uint64_t HEADER_BYTES = 8 + 4 + 4 + 7 * 8;

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
    uint64_t c[7];
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
    if (std::fread(c, 8, 7, f) != 7) {
        error = "truncated header";
        return false;
    }
    const uint64_t nodes = c[0], L = c[1], E = c[2], R = c[3], H = c[4], N = c[5], M = c[6];
    if (N >= (uint64_t(1) << 31) || nodes >= (uint64_t(1) << 32) || L >= (uint64_t(1) << 32)) {
        error = "header counts out of range (ops " + std::to_string(N) + ", links " +
                std::to_string(L) + ")";
        return false;
    }
    // Expected size from the counts (guarding against overflow with the limits above).
    const long double expect = (long double)HEADER_BYTES + L * (4 + 4 + 8 + 8 + 1) +
                               E * (8 + 4 + 8) + (R + 1) * 8 + H * 4 +
                               N * (1 + 8 + 8 + 4 + 4 + 4 + 4 + 1) + (N + 1) * 8 + M * 4 + 8;
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
    char end[8];
    if (!ok || std::fread(end, 1, 8, f) != 8 || std::memcmp(end, END_MAGIC, 8) != 0) {
        error = "cannot read the sections the header announces (damaged file)";
        return false;
    }

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
    return true;
}

}  // namespace xsim
