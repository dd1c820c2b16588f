package advisorylockgocron

// OncePerTickAt is OncePerTick reading the firing time from now, for tests
// on a fake clock.
var OncePerTickAt = oncePerTick
