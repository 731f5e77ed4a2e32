package index

import (
	"errors"
	"fmt"
	"sort"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
)

// ErrUnresolvedParent reports a run whose parent block is not indexed.
var ErrUnresolvedParent = errors.New("index: unknown parent block")

// DefaultCapacity is the capacity DefaultConfig sizes the summaries for
// (cached blocks per tier), the sidecar's default.
const DefaultCapacity = 65536

// Config identifies what the index keys. Start from DefaultConfig and set
// Model: New validates the result, a zero or invalid value is rejected,
// and nothing is filled in.
type Config struct {
	// Model is the canonical model name (the served name). Required.
	Model string
	// BlockSize is the endpoint's tokens per block, when known (> 0).
	BlockSize int
	// LearnBlockSize takes the block size from the first keyed run, for
	// an endpoint whose block size is not known yet; BlockSize must then
	// be 0. Default true (DefaultConfig knows no block size).
	LearnBlockSize bool
	// Params are the fleet-wide summary parameters. Default
	// summary.ForCapacity(DefaultCapacity).
	Params summary.Params
}

// DefaultConfig returns the defaults: the block size learned from the
// first run, summaries sized for DefaultCapacity blocks. Model has no
// default.
func DefaultConfig() Config {
	return Config{LearnBlockSize: true, Params: summary.ForCapacity(DefaultCapacity)}
}

// Validate checks c: a model, exactly one of a block size and
// LearnBlockSize, and valid summary parameters.
func (c Config) Validate() error {
	if c.Model == "" {
		return errors.New("index: empty model name")
	}
	switch {
	case c.LearnBlockSize && c.BlockSize != 0:
		return fmt.Errorf("index: block size %d given and LearnBlockSize set", c.BlockSize)
	case !c.LearnBlockSize && c.BlockSize <= 0:
		return fmt.Errorf("index: block size %d: want > 0, or LearnBlockSize", c.BlockSize)
	}
	return c.Params.Validate()
}

// Stats count what Apply saw.
type Stats struct {
	StoredBlocks      uint64 `json:"stored_blocks"`      // blocks of BlockStored runs indexed
	RemovedBlocks     uint64 `json:"removed_blocks"`     // copies removed
	Clears            uint64 `json:"clears"`             // AllBlocksCleared and Clear calls
	UnknownRemovals   uint64 `json:"unknown_removals"`   // removals of hashes not indexed
	UnresolvedParents uint64 `json:"unresolved_parents"` // runs dropped for an unknown parent
	SkippedGroups     uint64 `json:"skipped_groups"`     // runs of groups that are not full attention
	Placeholders      uint64 `json:"placeholders"`       // connector runs without tokens (placeholders) seen
	Invalid           uint64 `json:"invalid_runs"`       // runs that fail validation or carry unknown extras
	UnknownEvents     uint64 `json:"unknown_events"`     // events of a type this index does not know
	// Placeholder hashes attributed through the engine-hash map (also
	// counted in StoredBlocks), and those no tier maps (dropped).
	PlaceholdersResolved   uint64 `json:"placeholders_resolved"`
	PlaceholdersUnresolved uint64 `json:"placeholders_unresolved"`
}

// shelf is one tier's blocks and summary.
type shelf struct {
	blocks *table
	sum    *summary.Counting
}

// Index is one endpoint's exact index. Not safe for concurrent use.
type Index struct {
	cfg   Config
	tiers [tier.Count]*shelf // nil: a tier not seen
	stats Stats
	// KV-cache groups (index < 64) seen on runs naming their spec kind:
	// full attention, or another kind. Events without a kind (removals,
	// placeholders) are judged by their group.
	fullGroups, otherGroups uint64
	keys                    []blockkey.Key     // scratch
	ex                      [][]blockkey.Extra // scratch
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Index{cfg: cfg}, nil
}

// Stats returns the counters.
func (x *Index) Stats() Stats { return x.stats }

// BlockSize returns the block size in use (0 while it is still to be
// learned from the first run).
func (x *Index) BlockSize() int { return x.cfg.BlockSize }

// shelf returns t's shelf, nil for a tier not seen (or not a tier).
func (x *Index) shelf(t tier.Tier) *shelf {
	if !t.Valid() {
		return nil
	}
	return x.tiers[t]
}

// stock returns t's shelf, making it on first use.
func (x *Index) stock(t tier.Tier) *shelf {
	s := x.tiers[t]
	if s == nil {
		s = &shelf{blocks: newTable(), sum: summary.NewCounting(x.cfg.Params)}
		x.tiers[t] = s
	}
	return s
}

// Tiers lists the tiers seen, in tier order (GPU, CPU, STORAGE).
func (x *Index) Tiers() []tier.Tier {
	out := make([]tier.Tier, 0, tier.Count)
	for _, t := range tier.All() {
		if x.tiers[t] != nil {
			out = append(out, t)
		}
	}
	return out
}

// Blocks returns the distinct engine blocks indexed in a tier.
func (x *Index) Blocks(t tier.Tier) int {
	if s := x.shelf(t); s != nil {
		return s.blocks.len()
	}
	return 0
}

// Summary returns a tier's counting summary, nil for a tier not seen.
func (x *Index) Summary(t tier.Tier) *summary.Counting {
	if s := x.shelf(t); s != nil {
		return s.sum
	}
	return nil
}

// LookupEngine returns the canonical key and copy count of an engine hash.
func (x *Index) LookupEngine(tr tier.Tier, h uint64) (blockkey.Key, int, bool) {
	if t := x.shelf(tr); t != nil {
		if k, refs, ok := t.blocks.get(h); ok {
			return k, int(refs), true
		}
	}
	return 0, 0, false
}

// LookupCanonical returns the engine hashes holding a canonical key (a
// scan: for debugging, not for the hot path).
func (x *Index) LookupCanonical(tr tier.Tier, k blockkey.Key) []uint64 {
	var out []uint64
	if t := x.shelf(tr); t != nil {
		t.blocks.each(func(h uint64, key blockkey.Key) {
			if key == k {
				out = append(out, h)
			}
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Clear empties every tier (AllBlocksCleared, or an engine restart).
func (x *Index) Clear() {
	for _, t := range x.tiers {
		if t != nil {
			t.blocks.reset()
			t.sum.Reset()
		}
	}
	x.stats.Clears++
}

// Apply applies one event. It returns ErrUnresolvedParent for a dropped run,
// another error for a run it cannot key (counted in Stats), and nil otherwise.
func (x *Index) Apply(ev *kvevents.Event) error {
	switch ev.Type {
	case kvevents.TypeBlockStored:
		return x.stored(ev)
	case kvevents.TypeBlockRemoved:
		if !x.indexedGroup(ev) {
			x.stats.SkippedGroups++
			return nil
		}
		tr, ok := tier.FromMedium(ev.Medium)
		if !ok {
			x.stats.Invalid++
			return fmt.Errorf("index: unknown medium %q", ev.Medium)
		}
		t := x.tiers[tr]
		for _, h := range ev.BlockHashes {
			if t == nil {
				x.stats.UnknownRemovals++
				continue
			}
			k, ok, last := t.blocks.remove(h.Int)
			if !ok {
				x.stats.UnknownRemovals++
				continue
			}
			x.stats.RemovedBlocks++
			if last {
				t.sum.Remove(k)
			}
		}
	case kvevents.TypeAllBlocksCleared:
		x.Clear()
	default:
		x.stats.UnknownEvents++
	}
	return nil
}

// learn records the kind of the group a run names (kind and group both
// given; an absent group is group 0).
func (x *Index) learn(ev *kvevents.Event) {
	if ev.KVCacheSpecKind == "" {
		return
	}
	g, ok := groupBit(ev)
	if !ok {
		return
	}
	if fullAttention(ev.KVCacheSpecKind) {
		x.fullGroups |= g
	} else {
		x.otherGroups |= g
	}
}

// groupBit is the bit of ev's KV-cache group (absent: group 0), false for
// a group index outside 0..63.
func groupBit(ev *kvevents.Event) (uint64, bool) {
	if !ev.GroupIdx.Valid {
		return 1, true
	}
	if g := ev.GroupIdx.Value; g >= 0 && g < 64 {
		return 1 << g, true
	}
	return 0, false
}

// indexedGroup reports whether ev belongs to a group the index keys: by
// its spec kind when it names one, else (removals, placeholders) by the
// kind learned for its group, and group 0 (or none) when nothing was
// learned.
func (x *Index) indexedGroup(ev *kvevents.Event) bool {
	if ev.KVCacheSpecKind != "" {
		return fullAttention(ev.KVCacheSpecKind)
	}
	g, ok := groupBit(ev)
	switch {
	case !ok:
		return false
	case x.fullGroups&g != 0:
		return true
	case x.otherGroups&g != 0:
		return false
	}
	return g == 1
}

// fullAttention reports whether a spec kind is one the index keys.
func fullAttention(kind string) bool {
	return kind == "full_attention" || kind == "mla_attention"
}

func (x *Index) stored(ev *kvevents.Event) error {
	x.learn(ev)
	if !x.indexedGroup(ev) {
		x.stats.SkippedGroups++
		return nil
	}
	if ev.Placeholder() {
		return x.placeholder(ev)
	}
	if err := ev.Validate(); err != nil {
		x.stats.Invalid++
		return err
	}
	if x.cfg.LearnBlockSize {
		x.cfg.BlockSize, x.cfg.LearnBlockSize = ev.BlockSize, false
	}
	if ev.BlockSize != x.cfg.BlockSize {
		x.stats.Invalid++
		return fmt.Errorf("index: block size %d, endpoint uses %d", ev.BlockSize, x.cfg.BlockSize)
	}
	tr, ok := tier.FromMedium(ev.Medium)
	if !ok {
		x.stats.Invalid++
		return fmt.Errorf("index: unknown medium %q", ev.Medium)
	}
	t := x.stock(tr)
	parent := blockkey.Root(x.cfg.Model, ev.LoraName)
	if ev.HasParent {
		k, _, ok := t.blocks.get(ev.ParentBlockHash.Int)
		if !ok {
			x.stats.UnresolvedParents++
			return ErrUnresolvedParent
		}
		parent = k
	}
	n := len(ev.BlockHashes)
	x.ex = x.ex[:0]
	for i := 0; i < n; i++ {
		var raw []any
		if i < len(ev.ExtraKeys) {
			raw = ev.ExtraKeys[i]
		}
		ex, err := canonicalExtras(raw, ev.LoraName, i == 0 && !ev.HasParent)
		if err != nil {
			x.stats.Invalid++
			return err
		}
		x.ex = append(x.ex, ex)
	}
	x.keys = blockkey.AppendChain(x.keys[:0], parent, ev.BlockSize, ev.TokenIDs, x.ex)
	for i, h := range ev.BlockHashes {
		if t.blocks.add(h.Int, x.keys[i]) {
			t.sum.Add(x.keys[i])
		}
	}
	x.stats.StoredBlocks += uint64(n)
	return nil
}

// placeholder attributes a connector placeholder (hashes only: vLLM's
// OffloadingConnector without self-describing events sends one per
// offload block, named by its last GPU block's hash). Each hash stands alone — a canonical key already
// encodes its whole prefix — and is keyed through the engine-hash map:
// the offload tier's own (a copy it already holds), else another tier's
// (the GPU block the offload copied, or the CPU block a storage tier
// copied). The copy then counts in the offload tier's own map, so its
// removal and later placeholders resolve after the source copy is gone.
// An unmapped hash is counted and dropped, never guessed.
func (x *Index) placeholder(ev *kvevents.Event) error {
	x.stats.Placeholders++
	tr, ok := tier.FromMedium(ev.Medium)
	if !ok {
		x.stats.Invalid++
		return fmt.Errorf("index: unknown medium %q", ev.Medium)
	}
	if tr == tier.GPU { // the block pool sends full runs: no copy to attribute
		x.stats.PlaceholdersUnresolved += uint64(len(ev.BlockHashes))
		return nil
	}
	t := x.tiers[tr]
	for _, h := range ev.BlockHashes {
		k, ok := x.resolve(tr, h.Int)
		if !ok {
			x.stats.PlaceholdersUnresolved++
			continue
		}
		if t == nil {
			t = x.stock(tr)
		}
		if t.blocks.add(h.Int, k) {
			t.sum.Add(k)
		}
		x.stats.PlaceholdersResolved++
		x.stats.StoredBlocks++
	}
	return nil
}

// resolve returns the canonical key of engine hash h from tier tr's map,
// else from another tier's, in tier order: one engine hash names one
// content chain, whichever tier holds it.
func (x *Index) resolve(tr tier.Tier, h uint64) (blockkey.Key, bool) {
	if t := x.tiers[tr]; t != nil {
		if k, _, ok := t.blocks.get(h); ok {
			return k, true
		}
	}
	for i, t := range x.tiers {
		if tier.Tier(i) == tr || t == nil {
			continue
		}
		if k, _, ok := t.blocks.get(h); ok {
			return k, true
		}
	}
	return 0, false
}

// canonicalExtras turns one block's vLLM extra keys into canonical extras:
// the LoRA name (first, on every block) is dropped (it is in the root); a
// string on the first block of a run from token 0 is the cache salt;
// (identifier, offset) tuples are multimodal items; bytes are prompt-embeds
// digests. The salt comes first, as blockkey.Request.BlockExtras orders them.
func canonicalExtras(raw []any, lora string, first bool) ([]blockkey.Extra, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if lora != "" {
		if s, ok := raw[0].(string); ok && s == lora {
			raw = raw[1:]
		}
	}
	var out []blockkey.Extra
	salted := false
	for _, v := range raw {
		switch v := v.(type) {
		case string:
			if !first || salted {
				return nil, fmt.Errorf("index: unexpected string extra key on a block")
			}
			out = append([]blockkey.Extra{blockkey.SaltExtra(v)}, out...)
			salted = true
		case []any:
			if len(v) != 2 {
				return nil, fmt.Errorf("index: multimodal extra key of %d elements", len(v))
			}
			id, ok := v[0].(string)
			off, ok2 := v[1].(int64)
			if !ok || !ok2 {
				return nil, fmt.Errorf("index: multimodal extra key %v", v)
			}
			out = append(out, blockkey.Extra{Kind: blockkey.ExtraMM, Data: id, Offset: off})
		case []byte:
			out = append(out, blockkey.Extra{Kind: blockkey.ExtraEmbeds, Data: string(v)})
		default:
			return nil, fmt.Errorf("index: extra key of type %T", v)
		}
	}
	return out, nil
}
