// The fluid scale-up model: flows whose whole path is scale-up (NVLink/NVSwitch) links are not
// packetized but timed as a max-min fair share of those links, as in the flow backend and the
// ns-3 backend's scale_up=fluid. Each connected group of such links (one server's NVSwitch star)
// is an htsim EventSource with its own completion timer, so a flow starting or ending in one
// server re-solves the rates of that server's fluid flows only.
#ifndef XSIM_HTSIM_FLUID_H
#define XSIM_HTSIM_FLUID_H

#include <cstdint>
#include <vector>

#include "eventlist.h"
#include "input.h"
#include "xsim/maxmin.hpp"

namespace xsim {

class Replayer;

// State shared by all groups (indexed by link id): one solver, so a re-solve touches only the
// links its own flows use.
struct FluidScratch {
    MaxMinSolver solver;          // over every link id of the input (xsim/maxmin.hpp)
    std::vector<double> cap;      // bytes/ps each link serves now (timed link events change it)
    std::vector<double> rate;     // the solver's output, by position in a group's _active
};

class FluidGroup : public EventSource {
public:
    FluidGroup(EventList& ev, Replayer* owner, const Input& in, FluidScratch* scratch);
    // Start flow `op` of `bytes` bytes over route `route` now.
    void add(uint32_t op, uint64_t bytes, int32_t route);
    // The earliest last-byte time: called by htsim's event list.
    void doNextEvent() override;
    // A link this group's flows may use changed capacity (FluidScratch::cap): re-solve now.
    void capacity_changed();
    // Flow `op` moves to route `route` now (rerouting, whatif.cpp): re-solve.
    void reroute(uint32_t op, int32_t route);
    uint64_t recomputes() const { return _recomputes; }

private:
    struct Flow {
        uint32_t op;
        int32_t route;
        double rem;   // bytes not yet sent
        double rate;  // bytes per picosecond
    };
    void advance();
    void resolve();

    Replayer* _owner;
    const Input& _in;
    FluidScratch* _s;
    std::vector<Flow> _active;
    std::vector<std::pair<uint32_t, simtime_picosec>> _done;  // reused by doNextEvent
    simtime_picosec _last = 0;
    EventList::Handle _handle;
    bool _armed = false;
    uint64_t _recomputes = 0;
};

}  // namespace xsim

#endif
