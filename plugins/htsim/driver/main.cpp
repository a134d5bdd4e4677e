// xsim-htsim: replay an xsim-adapters trace on htsim.
//
//   xsim-htsim INPUT --out TIMES.bin --summary SUMMARY.json
//              [--protocol roce|ndp|eqds] [--mtu BYTES] [--queue-bytes BYTES] [--cwnd-pkts N] [--seed N]
//              [--scale-up fluid|packet] [--ack-every N] [--progress-s SECONDS]
//              [--queues QUEUES.csv]
//
// --queues writes per-link queue telemetry (link,peak_bytes,mean_bytes,drops,trims; one line
// per link, in link order) when the run completes.
// Writes TIMES.bin (start and end of every op in ps, in op order; binary, see below) and
// SUMMARY.json only
// when every op has ended; otherwise prints why on stderr and exits non-zero, so a partial
// result can never be mistaken for a complete one. Exit codes: 2 bad usage or input,
// 3 network cannot be built, 4 some ops never completed, 5 cannot write the output.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include <algorithm>

#include "config.h"
#include "eqds.h"
#include "eventlist.h"
#include "input.h"
#include "network.h"
#include "ndp.h"
#include "replay.h"
#include "roce.h"

using xsim::Input;
using xsim::Options;

namespace {

[[noreturn]] void fail(int code, const std::string& msg) {
    std::cerr << "xsim-htsim: " << msg << std::endl;
    std::exit(code);
}

const char* USAGE =
    "usage: xsim-htsim INPUT --out TIMES.bin --summary SUMMARY.json [--protocol roce|ndp|eqds]"
    " [--mtu BYTES] [--queue-bytes BYTES] [--cwnd-pkts N] [--seed N]"
    " [--scale-up fluid|packet] [--ack-every N] [--progress-s SECONDS] [--queues QUEUES.csv]"
    " [--transport TRANSPORT.txt]";

uint64_t parse_uint(const char* flag, const char* s) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (!*s || *end) fail(2, std::string(flag) + " expects a non-negative integer (got '" + s + "')");
    return v;
}

// Write `text` to `path` atomically: a crash never leaves a half file under the final name.
bool write_atomic(const std::string& path, const std::string& text) {
    std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) return false;
        f << text;
        if (!f.flush()) return false;
    }
    return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    std::string input_path, out_path, summary_path, queues_path, transport_path,
                proto_name = "roce",
                scale_up_name = "fluid";
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        bool has_value = i + 1 < argc;
        if (a == "--help" || a == "-h") {
            std::cout << USAGE << std::endl;
            return 0;
        } else if (a.rfind("--", 0) == 0 && !has_value) {
            fail(2, a + " needs a value\n" + USAGE);
        } else if (a == "--out") {
            out_path = argv[++i];
        } else if (a == "--summary") {
            summary_path = argv[++i];
        } else if (a == "--queues") {
            queues_path = argv[++i];
        } else if (a == "--transport") {
            transport_path = argv[++i];
        } else if (a == "--protocol") {
            proto_name = argv[++i];
            if (proto_name == "roce") opt.protocol = xsim::PROTO_ROCE;
            else if (proto_name == "ndp") opt.protocol = xsim::PROTO_NDP;
            else if (proto_name == "eqds") opt.protocol = xsim::PROTO_EQDS;
            else fail(2, "unknown protocol '" + proto_name + "' (this driver has roce, ndp, eqds)");
        } else if (a == "--mtu") {
            opt.mtu = (uint32_t)parse_uint("--mtu", argv[++i]);
            if (opt.mtu < 256) fail(2, "--mtu must be at least 256 bytes");
            // htsim keeps a packet's size in 16 bits; a RoCE packet is the MTU + 64 bytes
            if (opt.mtu > 65535 - RocePacket::ACKSIZE)
                fail(2, "--mtu must be at most " + std::to_string(65535 - RocePacket::ACKSIZE) +
                            " bytes (htsim's 16-bit packet size holds the MTU + the 64-byte"
                            " RoCE header)");
        } else if (a == "--queue-bytes") {
            opt.queue_bytes = (int64_t)parse_uint("--queue-bytes", argv[++i]);
        } else if (a == "--ack-every") {
            opt.ack_every = (uint32_t)parse_uint("--ack-every", argv[++i]);
            if (opt.ack_every < 1) fail(2, "--ack-every must be at least 1");
        } else if (a == "--cwnd-pkts") {
            opt.cwnd_pkts = (uint32_t)parse_uint("--cwnd-pkts", argv[++i]);
        } else if (a == "--scale-up") {
            scale_up_name = argv[++i];
            if (scale_up_name == "fluid") opt.scale_up_fluid = true;
            else if (scale_up_name == "packet") opt.scale_up_fluid = false;
            else fail(2, "unknown --scale-up mode '" + scale_up_name + "' (fluid or packet)");
        } else if (a == "--progress-s") {
            char* end = nullptr;
            const char* v = argv[++i];
            opt.progress_s = std::strtod(v, &end);
            if (!*v || *end || !(opt.progress_s >= 0))
                fail(2, std::string("--progress-s expects seconds >= 0 (got '") + v + "')");
        } else if (a == "--seed") {
            opt.seed = (uint32_t)parse_uint("--seed", argv[++i]);
        } else if (a.rfind("--", 0) == 0) {
            fail(2, "unknown option " + a + "\n" + USAGE);
        } else if (input_path.empty()) {
            input_path = a;
        } else {
            fail(2, std::string("more than one input file given\n") + USAGE);
        }
    }
    if (input_path.empty() || out_path.empty() || summary_path.empty()) fail(2, USAGE);
    if (opt.ack_every > 1 && opt.protocol != xsim::PROTO_ROCE)
        fail(2, "--ack-every applies to --protocol roce only (got " + proto_name + ")");

    // htsim's sources narrate every start and finish on stdout; a run with a million flows would
    // spend its time formatting text nobody reads.
    std::cout.setstate(std::ios::badbit);
    std::srand(opt.seed);
    srandom(opt.seed);

    auto t0 = std::chrono::steady_clock::now();
    Input in;
    std::string error;
    if (!xsim::read_input(input_path, in, error)) fail(2, input_path + ": " + error);
    if (!transport_path.empty()) {
        if (opt.protocol != xsim::PROTO_ROCE)
            fail(2, "--transport applies to --protocol roce only (got " + proto_name + ")");
        if (!xsim::read_transport(transport_path, in.links.size(), opt.transport, error))
            fail(2, error);
    }

    Packet::set_packet_size(opt.mtu);
    // Minimum retransmission timeouts in microseconds, the values of htsim's own drivers
    // (datacenter/main_roce.cpp: 1000 us, main_ndp.cpp: 50000 us, both "to avoid spurious
    // retransmits"; htsim's built-in default is 5000 us).
    constexpr uint32_t ROCE_MIN_RTO_US = 1000;
    constexpr uint32_t NDP_MIN_RTO_US = 50000;
    RoceSrc::setMinRTO(ROCE_MIN_RTO_US);
    NdpSrc::setMinRTO(NDP_MIN_RTO_US);
    NdpSrc::setRouteStrategy(SINGLE_PATH);
    NdpSink::setRouteStrategy(SINGLE_PATH);
    if (opt.protocol == xsim::PROTO_EQDS) {
        // EqdsSrc's constructor takes its MTU from Packet; the pull pacers need it before any
        // source exists. RTO as htsim's main_eqds: 150 us plus six queues' drain time at the
        // slowest link.
        EqdsSrc::_mtu = (uint16_t)opt.mtu;
        EqdsSrc::_mss = (uint16_t)(opt.mtu - EqdsSrc::_hdr_size);
        uint64_t slowest = UINT64_MAX;
        for (const xsim::LinkSpec& l : in.links) slowest = std::min(slowest, l.bps);
        int64_t q = opt.queue_bytes >= 0 ? opt.queue_bytes : (int64_t)15 * opt.mtu;
        double drain_us = in.links.empty() ? 0.0 : q * 6.0 * 8 * 1e6 / (double)slowest;
        EqdsSrc::_min_rto = timeFromUs(150.0 + drain_us);
        // The pull pacer sends one pull per MTU time; htsim's default credit per pull is 4 KiB
        // (for its 4 KiB MSS), which would cap a 9000-byte-MTU flow at ~45% of line rate.
        EqdsSink::_credit_per_pull = EqdsBasePacket::quantize_ceil(opt.mtu);
    }

    EventList& ev = EventList::getTheEventList();
    xsim::Replayer rep(ev, in, opt);
    if (!rep.build(error)) fail(3, "cannot build the network: " + error);
    auto t1 = std::chrono::steady_clock::now();
    uint64_t events = rep.run();
    auto t2 = std::chrono::steady_clock::now();

    size_t n = in.ops.size();
    if (rep.ops_done() != n) {
        std::string first = " (first:";
        for (uint32_t op : rep.unfinished(10)) first += " " + std::to_string(op);
        first += ")";
        if (rep.stalled())
            fail(4, "no op ended for 60 s of simulated time after the last link event (t=" +
                        std::to_string(EventList::now()) + " ps), with " +
                        std::to_string(n - rep.ops_done()) + " of " + std::to_string(n) +
                        " ops unfinished: a flow lost packets on a link that failed and its"
                        " transport never resends them (NDP resends only trimmed packets; use"
                        " roce or eqds with link failures)" + first);
        fail(4, "simulation ran out of events at t=" + std::to_string(EventList::now()) +
                    " ps with " + std::to_string(n - rep.ops_done()) + " of " + std::to_string(n) +
                    " ops unfinished (a flow never delivered all its bytes or the dependency"
                    " graph has a cycle)" + first);
    }

    // TIMES: binary, little-endian: b"XSIMHTO\0", u32 version 1, u32 0, u64 n, then
    // start_ps u64[n] and end_ps u64[n] in op order (xsim_htsim._output.read_times).
    std::string times;
    times.reserve(24 + 16 * n);
    times.append("XSIMHTO\0", 8);
    const uint32_t head[2] = {1, 0};
    const uint64_t count = n;
    times.append(reinterpret_cast<const char*>(head), sizeof head);
    times.append(reinterpret_cast<const char*>(&count), sizeof count);
    static_assert(sizeof(simtime_picosec) == 8, "times are written as 64-bit picoseconds");
    times.append(reinterpret_cast<const char*>(rep.start_ps().data()), 8 * n);
    times.append(reinterpret_cast<const char*>(rep.end_ps().data()), 8 * n);
    char buf[96];
    double wall = std::chrono::duration<double>(t2 - t0).count();
    double sim_wall = std::chrono::duration<double>(t2 - t1).count();
    std::snprintf(buf, sizeof buf, "%.6f", wall);
    std::string summary = "{\"protocol\": \"" + proto_name + "\", \"ops\": " + std::to_string(n) +
                          ", \"flows\": " + std::to_string(rep.flows_started()) +
                          ", \"flows_freed\": " + std::to_string(rep.flows_freed()) +
                          ", \"scale_up\": \"" + scale_up_name + "\"" +
                          ", \"fluid_flows\": " + std::to_string(rep.fluid_flows()) +
                          ", \"fluid_groups\": " + std::to_string(rep.fluid_groups()) +
                          ", \"fluid_recomputes\": " + std::to_string(rep.fluid_recomputes()) +
                          ", \"link_events\": " + std::to_string(rep.link_events_applied()) +
                          ", \"reroutes\": " + std::to_string(rep.reroutes()) +
                          ", \"links\": " + std::to_string(in.links.size()) +
                          ", \"events\": " + std::to_string(events) +
                          ", \"sim_ps\": " + std::to_string(EventList::now()) +
                          ", \"wall_s\": " + buf;
    std::snprintf(buf, sizeof buf, "%.6f", sim_wall);
    summary += std::string(", \"sim_wall_s\": ") + buf + ", \"mtu\": " + std::to_string(opt.mtu) +
               ", \"ack_every\": " + std::to_string(opt.ack_every) + "}\n";
    if (!write_atomic(out_path, times)) fail(5, "cannot write " + out_path);
    if (!queues_path.empty()) {
        std::vector<uint64_t> peak, drops, trims;
        std::vector<double> mean;
        rep.queue_stats(peak, mean, drops, trims);
        std::string q = "link,peak_bytes,mean_bytes,drops,trims";
        const std::vector<xsim::PortStats>* ps = rep.transport() ? &rep.port_stats() : nullptr;
        if (ps) q += ",drop_bytes,ecn_marks,pause_sent,pause_received,paused_ps,cnps";
        q += "\n";
        char row[320];
        for (size_t i = 0; i < peak.size(); i++) {
            int k = std::snprintf(row, sizeof row, "%zu,%llu,%.3f,%llu,%llu", i,
                                  (unsigned long long)peak[i], mean[i],
                                  (unsigned long long)drops[i], (unsigned long long)trims[i]);
            q.append(row, k);
            if (ps) {
                const xsim::PortStats& p = (*ps)[i];
                k = std::snprintf(row, sizeof row, ",%llu,%llu,%llu,%llu,%llu,%llu",
                                  (unsigned long long)p.drop_bytes, (unsigned long long)p.ecn_marks,
                                  (unsigned long long)p.pause_sent,
                                  (unsigned long long)p.pause_received,
                                  (unsigned long long)p.paused_ps, (unsigned long long)p.cnps);
                q.append(row, k);
            }
            q += "\n";
        }
        if (!write_atomic(queues_path, q)) fail(5, "cannot write " + queues_path);
    }
    if (!write_atomic(summary_path, summary)) fail(5, "cannot write " + summary_path);
    return 0;
}
