package gateway

import (
	"container/list"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of ExpensiveOptions.
const (
	DefaultExpensiveRequestsPerSecond  = 5
	DefaultExpensiveRequestsBurst      = 20
	DefaultMaxInFlightExpensivePerUser = 4
	DefaultMaxInFlightExpensive        = 64
	DefaultExpensiveTrackedUsers       = 10000
)

// ExpensiveOptions limits the expensive routes (route.Expensive: those that
// make the API server, a CSI driver or a service work for the caller, such
// as a match's dry run), per user: a user over a limit gets 429 with
// Retry-After. Zero values mean the defaults.
type ExpensiveOptions struct {
	// RequestsPerSecond and Burst are each user's token bucket
	// (--expensive-requests-per-second, --expensive-requests-burst): Burst
	// requests at once, then RequestsPerSecond.
	RequestsPerSecond float64
	Burst             int
	// MaxInFlightPerUser is how many expensive requests a user may have
	// in flight at once (--max-in-flight-expensive-per-user).
	MaxInFlightPerUser int
	// MaxInFlight is how many expensive requests all users together may
	// have in flight (--max-in-flight-expensive): many identities do not
	// add up to more.
	MaxInFlight int
	// TrackedUsers bounds the users whose buckets are kept
	// (--expensive-tracked-users): beyond it, the least recently seen idle
	// user's bucket is dropped (which only ever gives that user a fresh
	// burst), so the limiter's memory stays bounded whatever the number of
	// identities.
	TrackedUsers int
}

func (o *ExpensiveOptions) defaults() {
	if o.RequestsPerSecond <= 0 {
		o.RequestsPerSecond = DefaultExpensiveRequestsPerSecond
	}
	if o.Burst <= 0 {
		o.Burst = DefaultExpensiveRequestsBurst
	}
	if o.MaxInFlightPerUser <= 0 {
		o.MaxInFlightPerUser = DefaultMaxInFlightExpensivePerUser
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlightExpensive
	}
	if o.TrackedUsers <= 0 {
		o.TrackedUsers = DefaultExpensiveTrackedUsers
	}
}

// limiter holds each user's token bucket and requests in flight, in an LRU
// of at most TrackedUsers.
type limiter struct {
	o   ExpensiveOptions
	now func() time.Time

	mu       sync.Mutex
	users    map[string]*list.Element // of *userLimit
	lru      *list.List               // front: most recently seen
	inFlight int
}

type userLimit struct {
	name     string
	bucket   *rate.Limiter
	inFlight int
}

func newLimiter(o ExpensiveOptions) *limiter {
	o.defaults()
	return &limiter{o: o, now: time.Now, users: map[string]*list.Element{}, lru: list.New()}
}

// refusal is a request the limiter turned away: its message and when to
// come back.
type refusal struct {
	message    string
	retryAfter time.Duration
}

// acquire lets an expensive request of user in, and returns the function
// that lets it out, or says why not.
func (l *limiter) acquire(user string) (func(), *refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight >= l.o.MaxInFlight {
		return nil, &refusal{fmt.Sprintf("the gateway has %d expensive requests in flight, its limit (--max-in-flight-expensive)", l.inFlight), time.Second}
	}
	u, ok := l.user(user)
	if !ok {
		return nil, &refusal{fmt.Sprintf("the gateway tracks %d users with expensive requests in flight, its limit (--expensive-tracked-users)", len(l.users)), time.Second}
	}
	if u.inFlight >= l.o.MaxInFlightPerUser {
		return nil, &refusal{fmt.Sprintf("user %q has %d expensive requests in flight, the limit per user (--max-in-flight-expensive-per-user)", user, u.inFlight), time.Second}
	}
	now := l.now()
	r := u.bucket.ReserveN(now, 1)
	if d := r.DelayFrom(now); !r.OK() || d > 0 {
		r.CancelAt(now)
		return nil, &refusal{fmt.Sprintf("user %q made more than %d expensive requests at once or %g a second (--expensive-requests-burst, --expensive-requests-per-second)", user, l.o.Burst, l.o.RequestsPerSecond), d}
	}
	u.inFlight++
	l.inFlight++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			u.inFlight--
			l.inFlight--
		})
	}, nil
}

// user returns user's limits, made (and the least recently seen idle user
// dropped, at the bound) if need be; false when every tracked user has a
// request in flight.
func (l *limiter) user(name string) (*userLimit, bool) {
	if e, ok := l.users[name]; ok {
		l.lru.MoveToFront(e)
		return e.Value.(*userLimit), true
	}
	if len(l.users) >= l.o.TrackedUsers {
		e := l.lru.Back()
		for e != nil && e.Value.(*userLimit).inFlight > 0 {
			e = e.Prev()
		}
		if e == nil {
			return nil, false
		}
		l.lru.Remove(e)
		delete(l.users, e.Value.(*userLimit).name)
	}
	u := &userLimit{name: name, bucket: rate.NewLimiter(rate.Limit(l.o.RequestsPerSecond), l.o.Burst)}
	l.users[name] = l.lru.PushFront(u)
	return u, true
}

// tracked is how many users the limiter holds (for tests).
func (l *limiter) tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.users)
}

// retryAfter is the Retry-After header of d: whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}
