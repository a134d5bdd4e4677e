// Parser of the driver's input format. Strict: every count is checked, every id is range-checked,
// and an error names the line, so a damaged file never turns into a silently different run.
#include "input.h"

#include <fstream>
#include <sstream>

namespace xsim {

namespace {

struct Reader {
    std::ifstream f;
    uint64_t line_no = 0;
    std::string line;
    std::istringstream ss;

    bool next() {
        while (std::getline(f, line)) {
            ++line_no;
            if (line.empty() || line[0] == '#') continue;
            ss.clear();
            ss.str(line);
            return true;
        }
        return false;
    }
    std::string where() const { return "line " + std::to_string(line_no) + ": "; }
};

bool read_whatif(Reader& r, std::string word, Input& in, std::string& error);

bool header(Reader& r, const char* word, uint64_t& count, std::string& error) {
    std::string w;
    if (!r.next() || !(r.ss >> w >> count) || w != word) {
        error = r.where() + "expected '" + word + " <count>' (got '" + r.line + "')";
        return false;
    }
    return true;
}

}  // namespace

bool read_input(const std::string& path, Input& in, std::string& error) {
    Reader r;
    r.f.open(path);
    if (!r.f) {
        error = "cannot open input file " + path;
        return false;
    }
    std::string magic;
    int version = 0;
    if (!r.next() || !(r.ss >> magic >> version) || magic != "xsim-htsim") {
        error = r.where() + "not an xsim-htsim input (first line must be 'xsim-htsim 3')";
        return false;
    }
    if (version != 3) {
        error = "input format version " + std::to_string(version) +
                " is not supported by this driver (it reads version 3); rebuild the driver or"
                " rewrite the input with this checkout's xsim_htsim";
        return false;
    }
    uint64_t n;
    if (!header(r, "nodes", n, error)) return false;
    in.num_nodes = (uint32_t)n;

    if (!header(r, "links", n, error)) return false;
    in.links.resize(n);
    for (uint64_t i = 0; i < n; i++) {
        LinkSpec& l = in.links[i];
        int host = 0;
        if (!r.next() || !(r.ss >> l.src_node >> l.dst_node >> l.bps >> l.latency_ps >> host)) {
            error = r.where() + "link " + std::to_string(i) +
                    ": expected '<src> <dst> <bps> <latency_ps> <from_host>'";
            return false;
        }
        if (l.src_node >= in.num_nodes || l.dst_node >= in.num_nodes) {
            error = r.where() + "link " + std::to_string(i) + ": node id out of range";
            return false;
        }
        if (l.bps == 0) {
            error = r.where() + "link " + std::to_string(i) +
                    " has zero capacity; htsim cannot build a queue that never drains";
            return false;
        }
        l.from_host = host != 0;
    }

    if (!header(r, "events", n, error)) return false;
    in.events.resize(n);
    for (uint64_t i = 0; i < n; i++) {
        EventSpec& e = in.events[i];
        if (!r.next() || !(r.ss >> e.at_ps >> e.link >> e.bps)) {
            error = r.where() + "event " + std::to_string(i) + ": expected '<at_ps> <link> <bps>'";
            return false;
        }
        if (e.link >= in.links.size()) {
            error = r.where() + "event " + std::to_string(i) + ": link id out of range";
            return false;
        }
        if (i > 0 && e.at_ps < in.events[i - 1].at_ps) {
            error = r.where() + "event " + std::to_string(i) + ": events must be in time order";
            return false;
        }
    }

    if (!header(r, "routes", n, error)) return false;
    in.routes.resize(n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k;
        if (!r.next() || !(r.ss >> k)) {
            error = r.where() + "route " + std::to_string(i) + ": expected '<hops> <link>...'";
            return false;
        }
        in.routes[i].resize(k);
        for (uint64_t j = 0; j < k; j++) {
            if (!(r.ss >> in.routes[i][j]) || in.routes[i][j] >= in.links.size()) {
                error = r.where() + "route " + std::to_string(i) + ": bad link id at hop " +
                        std::to_string(j);
                return false;
            }
        }
    }

    if (!header(r, "ops", n, error)) return false;
    in.ops.resize(n);
    for (uint64_t i = 0; i < n; i++) {
        OpSpec& op = in.ops[i];
        op.src_rank = op.dst_rank = op.fwd_route = op.rev_route = -1;
        op.value = 0;
        op.scale_up = false;
        char kind = 0;
        bool ok = r.next() && (bool)(r.ss >> kind);
        if (ok && kind == 'C') {
            op.kind = OP_COMPUTE;
            ok = (bool)(r.ss >> op.value);
        } else if (ok && kind == 'F') {
            op.kind = OP_FLOW;
            int su = -1;
            ok = (bool)(r.ss >> op.value >> op.src_rank >> op.dst_rank >> op.fwd_route >>
                        op.rev_route >> su) && (su == 0 || su == 1);
            op.scale_up = su == 1;
            ok = ok && op.fwd_route < (int64_t)in.routes.size() &&
                 op.rev_route < (int64_t)in.routes.size() &&
                 (op.fwd_route < 0) == (op.rev_route < 0);
        } else if (ok && kind == 'B') {
            op.kind = OP_BARRIER;
        } else {
            ok = false;
        }
        if (!ok) {
            error = r.where() + "op " + std::to_string(i) +
                    ": expected 'C <duration_ps>', 'F <bytes> <src> <dst> <route> <reverse>"
                    " <scale_up 0|1>' or 'B'";
            return false;
        }
    }

    uint64_t edges;
    if (!header(r, "succ", edges, error)) return false;
    in.succ_start.assign(in.ops.size() + 1, 0);
    in.succ.reserve(edges);
    for (uint64_t i = 0; i < in.ops.size(); i++) {
        uint64_t k;
        if (!r.next() || !(r.ss >> k)) {
            error = r.where() + "successors of op " + std::to_string(i) + ": expected '<k> <op>...'";
            return false;
        }
        for (uint64_t j = 0; j < k; j++) {
            uint32_t s;
            if (!(r.ss >> s) || s >= in.ops.size()) {
                error = r.where() + "successors of op " + std::to_string(i) + ": bad op id";
                return false;
            }
            in.succ.push_back(s);
        }
        in.succ_start[i + 1] = in.succ.size();
    }
    if (in.succ.size() != edges) {
        error = "succ section lists " + std::to_string(in.succ.size()) + " edges, header says " +
                std::to_string(edges);
        return false;
    }
    std::string w;
    if (!r.next() || !(r.ss >> w)) {
        error = r.where() + "expected 'end' (the file is truncated)";
        return false;
    }
    if (w == "slow" || w == "reroute") {
        // leaves the line after the sections in r (its words unread)
        if (!read_whatif(r, w, in, error)) return false;
        w.clear();
        r.ss >> w;
    }
    if (w != "end") {
        error = r.where() + "expected 'end' (the file is truncated or has extra lines)";
        return false;
    }
    return true;
}

namespace {

// The what-if sections, from the current line (which holds `word`) on:
//   slow <R> <S>                             R ranks, S segments in all
//   <k> (<lo_ps> <hi_ps> <factor>) x k       R lines (hi_ps -1: to the end of the run)
//   slowops <K>
//   <op> <rank>                              K lines: compute ops stretched by their rank
//   reroute <E>
//   <at_ps> <k> (<op> <fwd> <rev>) x k       E lines, one per link-event instant
bool read_whatif(Reader& r, std::string word, Input& in, std::string& error) {
    WhatIf& w = in.whatif;
    if (word == "slow") {
        uint64_t ranks = 0, segs = 0;
        if (!(r.ss >> ranks >> segs)) {
            error = r.where() + "expected 'slow <ranks> <segments>'";
            return false;
        }
        w.slow_start.assign(1, 0);
        for (uint64_t i = 0; i < ranks; i++) {
            uint64_t k;
            if (!r.next() || !(r.ss >> k)) {
                error = r.where() + "slowdowns of rank " + std::to_string(i) +
                        ": expected '<k> <lo_ps> <hi_ps> <factor> ...'";
                return false;
            }
            for (uint64_t j = 0; j < k; j++) {
                SlowSegment g{};
                if (!(r.ss >> g.lo_ps >> g.hi_ps >> g.factor) || !(g.factor > 0) ||
                    g.lo_ps < 0 || (g.hi_ps >= 0 && g.hi_ps <= g.lo_ps)) {
                    error = r.where() + "slowdowns of rank " + std::to_string(i) +
                            ": bad segment " + std::to_string(j);
                    return false;
                }
                w.slow_seg.push_back(g);
            }
            w.slow_start.push_back(w.slow_seg.size());
        }
        if (w.slow_seg.size() != segs) {
            error = r.where() + "slow section lists " + std::to_string(w.slow_seg.size()) +
                    " segments, header says " + std::to_string(segs);
            return false;
        }
        uint64_t k;
        if (!header(r, "slowops", k, error)) return false;
        w.slow_rank.assign(in.ops.size(), -1);
        for (uint64_t i = 0; i < k; i++) {
            uint64_t op;
            int64_t rank;
            if (!r.next() || !(r.ss >> op >> rank) || op >= in.ops.size() || rank < 0 ||
                (uint64_t)rank >= ranks || in.ops[op].kind != OP_COMPUTE) {
                error = r.where() + "slowops entry " + std::to_string(i) +
                        ": expected '<compute op> <rank>' in range";
                return false;
            }
            w.slow_rank[op] = (int32_t)rank;
        }
        if (!r.next() || !(r.ss >> word)) {
            error = r.where() + "expected 'reroute' or 'end'";
            return false;
        }
        if (word != "reroute") {  // hand the line back: the caller expects 'end'
            r.ss.clear();
            r.ss.str(r.line);
            return true;
        }
    }
    uint64_t n;
    if (!(r.ss >> n)) {
        error = r.where() + "expected 'reroute <epochs>'";
        return false;
    }
    w.epochs.resize(n);
    for (uint64_t i = 0; i < n; i++) {
        RerouteEpoch& e = w.epochs[i];
        uint64_t k;
        if (!r.next() || !(r.ss >> e.at_ps >> k) || (i && e.at_ps <= w.epochs[i - 1].at_ps)) {
            error = r.where() + "reroute epoch " + std::to_string(i) +
                    ": expected '<at_ps> <k> <op> <fwd> <rev> ...' in time order";
            return false;
        }
        e.detours.resize(k);
        for (uint64_t j = 0; j < k; j++) {
            Detour& d = e.detours[j];
            bool ok = (bool)(r.ss >> d.op >> d.fwd >> d.rev) && d.op < in.ops.size() &&
                      in.ops[d.op].kind == OP_FLOW && d.fwd < (int64_t)in.routes.size() &&
                      d.rev < (int64_t)in.routes.size() && (j == 0 || d.op > e.detours[j - 1].op);
            if (!ok) {
                error = r.where() + "reroute epoch " + std::to_string(i) + ": bad detour " +
                        std::to_string(j);
                return false;
            }
        }
    }
    if (!r.next()) {  // nothing after the sections: the caller reports the missing 'end'
        r.ss.clear();
        r.ss.str("");
    }
    return true;
}

}  // namespace

}  // namespace xsim
