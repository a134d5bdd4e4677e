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
    if (!r.next() || !(r.ss >> w) || w != "end") {
        error = r.where() + "expected 'end' (the file is truncated or has extra lines)";
        return false;
    }
    return true;
}

}  // namespace xsim
