package peers

import "fmt"

// New returns the named policy with its peer's defaults.
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
	default:
		err = fmt.Errorf("unknown peer policy %q: want one of %v", name, Names())
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
