package backlogui

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// maxSelected bounds the jobs one selection action names.
const maxSelected = backlog.MaxListLimit

// jobsAction retries, cancels or deletes the selected jobs (form fields
// action, id…, back).
func (h *handler) jobsAction(w http.ResponseWriter, r *http.Request) error {
	action := r.PostForm.Get("action")
	var do func(uuid.UUID) error
	ctx := r.Context()
	switch action {
	case ActionRetry:
		do = func(id uuid.UUID) error { _, err := h.q.Retry(ctx, id); return err }
	case ActionCancel:
		do = func(id uuid.UUID) error { _, err := h.q.Cancel(ctx, id); return err }
	case ActionDelete:
		do = func(id uuid.UUID) error { return h.q.Delete(ctx, id) }
	default:
		return badRequest("action: want retry, cancel or delete")
	}
	raw := r.PostForm["id"]
	if len(raw) == 0 {
		return badRequest("No job selected.")
	}
	if len(raw) > maxSelected {
		return badRequest(fmt.Sprintf("At most %d jobs at once; use \"apply to all matching\".", maxSelected))
	}
	ids := make([]uuid.UUID, len(raw))
	for i, s := range raw {
		id, err := uuid.Parse(s)
		if err != nil {
			return badRequest("not a job ID: " + s)
		}
		ids[i] = id
	}
	if err := h.authorize(r, action); err != nil {
		return err
	}
	done, failed := 0, []string{}
	for _, id := range ids {
		if err := do(id); err != nil {
			if statusOf(err) >= 500 {
				// The database is unreachable (or worse): the next
				// jobs would fail alike, so stop and say how far it got.
				return fmt.Errorf("%s stopped after %d of %d job(s): %w", action, done, len(ids), err)
			}
			failed = append(failed, err.Error())
			continue
		}
		done++
	}
	h.cfg.logger.Info("backlogui: action", "action", action, "jobs", len(ids), "done", done)
	back := r.PostForm.Get("back")
	if len(failed) > 0 {
		h.flash(w, "error", fmt.Sprintf("%s: %d of %d done; %s", action, done, len(ids), strings.Join(failed, "; ")))
	} else {
		h.flash(w, "ok", fmt.Sprintf("%s: %d job(s) done.", action, done))
	}
	h.redirect(w, r, back)
	return nil
}

// bulkAction applies an action to every job matching the filter (form
// fields action, filter: the jobs page's query string).
func (h *handler) bulkAction(w http.ResponseWriter, r *http.Request) error {
	action := r.PostForm.Get("action")
	if _, ok := bulkVerbs[action]; !ok {
		return badRequest("action: want retry, cancel or delete")
	}
	v, err := url.ParseQuery(r.PostForm.Get("filter"))
	if err != nil {
		return badRequest("filter: " + err.Error())
	}
	q, err := parseJobsQuery(v)
	if err != nil {
		return err
	}
	if err := h.authorize(r, action+"-all"); err != nil {
		return err
	}
	f := bulkFilter(q.filter, action)
	if len(f.States) == 0 {
		return badRequest("No job in the filter's states can be " + map[string]string{"retry": "retried", "cancel": "cancelled",
			"delete": "deleted"}[action] + ".")
	}
	var n int
	switch action {
	case "retry":
		n, err = h.q.RetryWhere(r.Context(), f)
	case "cancel":
		n, err = h.q.CancelWhere(r.Context(), f)
	case "delete":
		n, err = h.q.DeleteWhere(r.Context(), f)
	}
	h.cfg.logger.Info("backlogui: bulk action", "action", action, "jobs", n, "err", err)
	if err != nil {
		return fmt.Errorf("%s stopped after %d job(s): %w", action, n, err)
	}
	h.flash(w, "ok", fmt.Sprintf("%s: %d matching job(s) done.", action, n))
	h.redirect(w, r, "/jobs?"+q.Encode())
	return nil
}

// typeAction pauses or resumes a type (form fields action, type, back).
func (h *handler) typeAction(w http.ResponseWriter, r *http.Request) error {
	action, typ := r.PostForm.Get("action"), strings.TrimSpace(r.PostForm.Get("type"))
	if action != ActionPause && action != ActionResume {
		return badRequest("action: want pause or resume")
	}
	if typ == "" {
		return badRequest("type: required")
	}
	if err := h.authorize(r, action); err != nil {
		return err
	}
	var err error
	if action == ActionPause {
		err = h.q.Pause(r.Context(), typ)
	} else {
		err = h.q.Resume(r.Context(), typ)
	}
	if err != nil {
		return err
	}
	h.cfg.logger.Info("backlogui: action", "action", action, "type", typ)
	h.flash(w, "ok", action+"d type "+typ+".")
	h.redirect(w, r, r.PostForm.Get("back"))
	return nil
}
