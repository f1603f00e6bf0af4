package flow

// graph is a flow's DAG as indexes, computed once per spec: a stored
// flow's steps never change, so every transition of a 10,000-step flow
// reads these instead of rebuilding them from the names.
type graph struct {
	needs  [][]int // each step's needs (Needs)
	direct [][]int // each step's direct dependents
	index  map[string]int
	// topo lists the steps so that each comes after every step it needs
	// (nil when the needs hold a cycle, which a stored flow's do not).
	topo     []int
	tolerant bool // some step has max_failed_needs
}

func newGraph(steps []Step) *graph {
	g := &graph{needs: Needs(steps), index: make(map[string]int, len(steps))}
	for i, st := range steps {
		g.index[st.Name] = i
		g.tolerant = g.tolerant || st.MaxFailedNeeds > 0
	}
	g.direct = directDependents(g.needs)
	// Kahn's order: linear in steps and needs.
	pending := make([]int, len(steps))
	var ready []int
	for i, ns := range g.needs {
		pending[i] = len(ns)
		if len(ns) == 0 {
			ready = append(ready, i)
		}
	}
	order := make([]int, 0, len(steps))
	for len(ready) > 0 {
		i := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		order = append(order, i)
		for _, d := range g.direct[i] {
			if pending[d]--; pending[d] == 0 {
				ready = append(ready, d)
			}
		}
	}
	if len(order) == len(steps) {
		g.topo = order
	}
	return g
}

// graph returns f's DAG, computing it on first use. A flow shared by the
// part cache has its graph set before it is shared.
func (f *Flow) graph() *graph {
	if f.g == nil || len(f.g.needs) != len(f.Steps) {
		f.g = newGraph(f.Steps)
	}
	return f.g
}

// stepIndex returns the index of the step named name, or -1.
func (f *Flow) stepIndex(name string) int {
	if i, ok := f.graph().index[name]; ok {
		return i
	}
	return -1
}
