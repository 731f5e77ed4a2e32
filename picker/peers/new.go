package peers

import "fmt"

// New returns the named policy (Names, ArmNames) with its peer's defaults.
func New(name string) (Policy, error) {
	var p Policy
	var err error
	switch name {
	case LLMD:
		p, err = asPolicy(NewLLMD(DefaultLLMDConfig()))
	case LLMDPrecise:
		p, err = asPolicy(NewLLMDPrecise(DefaultLLMDPreciseConfig()))
	case Dynamo:
		p, err = asPolicy(NewDynamo(DefaultDynamoConfig()))
	case SGLang:
		p, err = asPolicy(NewSGLang(DefaultSGLangConfig()))
	case LLMDPreciseP2P:
		p, err = asPolicy(NewLLMDPreciseP2P(DefaultLLMDPreciseP2PConfig()))
	case LLMDP2P:
		p, err = asPolicy(NewLLMDP2P(DefaultLLMDP2PConfig()))
	case LLMDLoad:
		p, err = asPolicy(NewLLMDLoad(DefaultLLMDLoadConfig()))
	case LLMDLoadP2P:
		p, err = asPolicy(NewLLMDLoadP2P(DefaultLLMDLoadP2PConfig()))
	case DynamoHint:
		p, err = asPolicy(NewDynamoHint(DefaultDynamoHintConfig()))
	default:
		err = fmt.Errorf("unknown peer policy %q: want one of %v, or an arm with KV pulls: %v", name, Names(), ArmNames())
	}
	return p, err
}

// asPolicy keeps a failed constructor's typed nil out of the interface.
func asPolicy[T Policy](p T, err error) (Policy, error) {
	if err != nil {
		return nil, err
	}
	return p, nil
}
