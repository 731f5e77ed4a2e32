package tier

// Tier is where a block sits.
type Tier uint8

// The tiers, most valuable first.
const (
	GPU Tier = iota
	CPU
	Storage
	// Count is the number of tiers: the length of arrays indexed by Tier.
	Count = 3
)

// All lists the tiers in order (a fresh array each call: nothing shared
// to mutate).
func All() [Count]Tier { return [Count]Tier{GPU, CPU, Storage} }

// String is the tier's wire name (vLLM's MEDIUM_* values, and the summary
// stream's tier field): GPU, CPU or STORAGE.
func (t Tier) String() string {
	switch t {
	case GPU:
		return "GPU"
	case CPU:
		return "CPU"
	case Storage:
		return "STORAGE"
	}
	return "UNKNOWN"
}

// Valid reports whether t is one of the tiers.
func (t Tier) Valid() bool { return int(t) < Count }

// Parse reads a wire name (GPU, CPU, STORAGE).
func Parse(name string) (Tier, bool) {
	for _, t := range All() {
		if t.String() == name {
			return t, true
		}
	}
	return 0, false
}

// FromMedium maps a KV event's medium to its tier: "" and GPU are GPU,
// CPU is CPU, STORAGE and the FS and OBJ connectors' media are storage.
// A medium it does not know is reported (such events are skipped).
func FromMedium(medium string) (Tier, bool) {
	switch medium {
	case "", "GPU":
		return GPU, true
	case "CPU":
		return CPU, true
	case "STORAGE", "FS", "OBJ":
		return Storage, true
	}
	return 0, false
}
