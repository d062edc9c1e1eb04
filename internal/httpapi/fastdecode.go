package httpapi

// decodeCheckFast decodes the common shape of a check body without
// reflection: one JSON object whose keys are the exact field names of
// checkRequest, each at most once, whose values are strings without escape
// sequences or control characters (cost: a non-negative integer), with
// nothing but white space after it. It reports false, having decided
// nothing, for any other input (escapes, non-ASCII bytes, other key
// spellings, null, repeated keys, errors), which the strict decoder then
// decodes and, when it must, refuses with the error naming the field. On
// every input it accepts it fills cr as encoding/json would
// (FuzzDecodeCheckFast holds it to that).
func decodeCheckFast(data []byte, cr *checkRequest) bool {
	var seen uint16
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipSpace(data, i+1) == len(data)
	}
	for {
		key, j, ok := plainString(data, i)
		if !ok {
			return false
		}
		i = skipSpace(data, j)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		var bit uint16
		var dst *string
		switch key {
		case "client_id":
			bit, dst = 1<<0, &cr.ClientID
		case "resource":
			bit, dst = 1<<1, &cr.Resource
		case "operation":
			bit, dst = 1<<2, &cr.Operation
		case "priority":
			bit, dst = 1<<3, &cr.Priority
		case "idempotency_key":
			bit, dst = 1<<4, &cr.IdempotencyKey
		case "user":
			bit, dst = 1<<5, &cr.User
		case "ip":
			bit, dst = 1<<6, &cr.IP
		case "api_key":
			bit, dst = 1<<7, &cr.APIKey
		case "method":
			bit, dst = 1<<8, &cr.Method
		case "cost":
			bit = 1 << 9
		default:
			return false
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		if dst != nil {
			v, j, ok := plainString(data, i)
			if !ok {
				return false
			}
			*dst, i = v, j
		} else {
			n, j, ok := smallUint(data, i)
			if !ok {
				return false
			}
			cr.Cost = &n
			i = j
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return skipSpace(data, i+1) == len(data)
		default:
			return false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at data[i] made only of printable ASCII
// without backslashes, and returns it and the index after its closing
// quote.
func plainString(data []byte, i int) (s string, next int, ok bool) {
	if i >= len(data) || data[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return string(data[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return "", 0, false
		}
	}
	return "", 0, false
}

// smallUint reads a JSON integer at data[i] of at most 18 digits with no
// sign, fraction or exponent, and returns it and the index after it.
func smallUint(data []byte, i int) (n int64, next int, ok bool) {
	j := i
	for j < len(data) && data[j] >= '0' && data[j] <= '9' {
		n = n*10 + int64(data[j]-'0')
		j++
	}
	switch {
	case j == i || j-i > 18:
		return 0, 0, false
	case data[i] == '0' && j-i > 1: // a leading zero is not JSON
		return 0, 0, false
	case j < len(data) && (data[j] == '.' || data[j] == 'e' || data[j] == 'E'):
		return 0, 0, false
	}
	return n, j, true
}
